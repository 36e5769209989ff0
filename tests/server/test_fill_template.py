"""The config.pbtxt template and the tool that fills it (no server needed)."""

import re
import subprocess
import sys

import pytest
from fill_template import fill, parse_substitutions
from triton_harness import ROOT

from trtllm_bole.serving.protocol import INPUT_NAMES, OUTPUT_NAMES

TEMPLATE = ROOT / "triton_server" / "model_repository_template" / "bole" / "config.pbtxt"


def test_substitutions_parse_and_fill_only_what_is_named():
    values = parse_substitutions("engine_dir:/a:b, triton_max_batch_size:16,")
    assert values == {"engine_dir": "/a:b", "triton_max_batch_size": "16"}
    assert fill('x: "${engine_dir}" y: "${device}" z: ${triton_max_batch_size}', values) == (
        'x: "/a:b" y: "${device}" z: 16'
    )
    with pytest.raises(ValueError, match="kind must be filled"):
        fill("kind: ${kind}  # Triton's own field", {})
    with pytest.raises(ValueError, match="kind must be filled"):  # wrote "kind: ", which Triton cannot parse
        fill("kind: ${kind}", {"kind": ""})
    with pytest.raises(ValueError, match="key:value"):
        parse_substitutions("engine_dir")


def test_a_name_the_template_lacks_is_refused():
    """``max_batch_sise:4`` exited 0 and left ``${max_batch_size}`` to the model's default."""
    template = 'a: "${max_batch_size}" b: "${device}"'
    with pytest.raises(ValueError, match=r"no placeholder \$\{max_batch_sise\}, \$\{z\} \(misspelt"):
        fill(template, {"max_batch_sise": "4", "device": "cpu", "z": ""})
    assert fill(template, {"max_batch_size": "4"}) == 'a: "4" b: "${device}"'


def test_tritons_own_fields_are_checked_and_a_name_is_given_once():
    """``triton_max_batch_size:0`` made a model that loaded, reported ready and refused every request (no
    batch dimension); ``abc``, an unknown kind or a value with a newline (a line of its own in the
    config) were written as given; a name given twice kept its last value without a word."""
    template = TEMPLATE.read_text()
    good = {"triton_max_batch_size": "16", "instance_kind": "KIND_GPU"}
    assert "max_batch_size: 16" in fill(template, good)
    for name, value in [("triton_max_batch_size", "0"), ("triton_max_batch_size", "abc"),
                        ("triton_max_batch_size", "4\nname: x"), ("instance_kind", "KIND_FOO")]:  # fmt: skip
        with pytest.raises(ValueError, match=f"{name} must be .*, got {re.escape(repr(value))}"):
            fill(template, {**good, name: value})
    with pytest.raises(ValueError, match="device is given twice \\('cpu' and 'cuda'\\)"):
        parse_substitutions("device:cpu,device:cuda")


def test_filled_values_reach_triton_as_given(tmp_path):
    """Parsed by Triton's own ModelConfig message: a quote or a backslash in a path is kept (a quote once
    ended the string early, and Triton refused the config)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    engine_dir = str(tmp_path / 'my "best" engine\\v2')
    values = {"engine_dir": engine_dir, "triton_max_batch_size": "4", "instance_kind": "KIND_CPU"}
    config = text_format.Parse(fill(TEMPLATE.read_text(), values), model_config_pb2.ModelConfig())
    assert config.parameters["engine_dir"].string_value == engine_dir and config.max_batch_size == 4


def test_template_declares_a_decoupled_python_model_with_the_protocols_tensors():
    text = TEMPLATE.read_text()
    assert 'backend: "python"' in text and "decoupled: true" in text
    inputs, outputs = text.split("\ninput [")[1].split("\noutput [")
    assert tuple(re.findall(r'name: "(\w+)"', inputs)) == INPUT_NAMES
    assert tuple(re.findall(r'name: "(\w+)"', outputs)) == OUTPUT_NAMES
    for name in ("text_input", "input_ids", "max_tokens", "temperature", "top_k", "top_p", "random_seed",
                 "stream", "end_id", "stop_words", "text_output", "output_ids", "acceptance_rate",
                 "total_accepted_draft_tokens", "total_draft_tokens"):  # fmt: skip
        assert name in INPUT_NAMES + OUTPUT_NAMES, name  # TensorRT-LLM's ensemble names


def test_fill_template_cli_in_place(tmp_path):
    config = tmp_path / "config.pbtxt"
    config.write_text(TEMPLATE.read_text())
    tool = ROOT / "triton_server" / "fill_template.py"
    subprocess.run(
        [sys.executable, str(tool), "-i", str(config), "triton_max_batch_size:4,instance_kind:KIND_CPU"],
        check=True,
    )
    text = config.read_text()
    assert "max_batch_size: 4" in text and "kind: KIND_CPU" in text
    assert "${engine_dir}" in text  # unset parameters stay placeholders: the model's defaults apply
    config.write_text(TEMPLATE.read_text())
    partial = subprocess.run(
        [sys.executable, str(tool), "-i", str(config), "engine_dir:/e"], capture_output=True, text=True
    )
    assert partial.returncode == 1 and "instance_kind, triton_max_batch_size must be filled" in partial.stderr
    assert config.read_text() == TEMPLATE.read_text()
    misspelt = subprocess.run(
        [sys.executable, str(tool), "-i", str(config), "triton_max_batch_size:4,instance_kind:KIND_CPU,"
         "max_batch_sise:4"], capture_output=True, text=True,
    )  # fmt: skip
    assert misspelt.returncode == 1 and "no placeholder ${max_batch_sise}" in misspelt.stderr
    assert config.read_text() == TEMPLATE.read_text()


def test_fill_template_cli_names_a_file_it_cannot_read(tmp_path):
    """An error line and exit 1, as for a bad substitution (it was a FileNotFoundError traceback)."""
    tool = ROOT / "triton_server" / "fill_template.py"
    missing = tmp_path / "missing" / "config.pbtxt"
    done = subprocess.run(
        [sys.executable, str(tool), "-i", str(missing), "instance_kind:KIND_CPU"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and done.stderr.startswith("error: ") and str(missing) in done.stderr
    assert "Traceback" not in done.stderr
