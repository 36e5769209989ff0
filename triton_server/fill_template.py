"""Fill ``${name}`` placeholders of a ``config.pbtxt`` template (as TensorRT-LLM backend's
``tools/fill_template.py`` does)::

    python triton_server/fill_template.py -i model_repository/bole/config.pbtxt \\
        triton_max_batch_size:16,instance_kind:KIND_CPU,engine_dir:/path/to/engine,max_batch_size:16

Placeholders not named stay as they are (a name the template lacks is an error); the Bole model reads a
parameter still holding ``${...}`` (or ``""``) as unset and uses its default. A placeholder outside a
quoted ``string_value`` (Triton's own fields: ``triton_max_batch_size``, ``instance_kind``) has no
default: left unfilled, it is an error here rather than a config Triton cannot parse.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from string import Template

_UNQUOTED = re.compile(r"^[^\"#]*\$\{(\w+)\}", re.MULTILINE)

TRITON_FIELDS = {
    "triton_max_batch_size": (
        re.compile(r"[1-9][0-9]*"),
        "a positive integer (requests carry batch dimension 1)",
    ),
    "instance_kind": (
        re.compile(r"KIND_(AUTO|CPU|GPU|MODEL)"),
        "KIND_CPU, KIND_GPU, KIND_AUTO or KIND_MODEL",
    ),
}
"""Triton's own fields, written into ``config.pbtxt`` unquoted: a value is checked here, or Triton reads a
model that refuses every request (``max_batch_size: 0`` drops the batch dimension) or a value that starts
a line of its own."""


def parse_substitutions(text: str) -> dict[str, str]:
    """``"a:1,b:x"`` -> ``{"a": "1", "b": "x"}`` (values may contain ``:``, not ``,``)."""
    values = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition(":")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"substitution {item!r} is not key:value")
        if key in values:
            raise ValueError(f"{key} is given twice ({values[key]!r} and {value.strip()!r})")
        values[key] = value.strip()
    return values


def fill(template: str, values: dict[str, str]) -> str:
    """Values are escaped for the quoted strings of protobuf's text format (a path with a ``"`` ended
    its ``string_value`` early, a ``\\`` started an escape). A name with no ``${name}`` in the template
    is refused: misspelt, it left the placeholder to its default without a word."""
    parsed = Template(template)
    unknown = sorted(set(values) - set(parsed.get_identifiers()))
    if unknown:
        names = ", ".join(f"${{{name}}}" for name in unknown)
        raise ValueError(f"the template has no placeholder {names} (misspelt, or filled already?)")
    for name, (pattern, meaning) in TRITON_FIELDS.items():
        if values.get(name) and not pattern.fullmatch(values[name]):
            raise ValueError(f"{name} must be {meaning}, got {values[name]!r}")
    escaped = {k: v.replace("\\", "\\\\").replace('"', '\\"') for k, v in values.items()}
    filled = parsed.safe_substitute(escaped)
    blank = {name for name in _UNQUOTED.findall(template) if name in values and not values[name]}
    missing = sorted(blank | set(_UNQUOTED.findall(filled)))
    if missing:
        raise ValueError(f"{', '.join(missing)} must be filled: Triton's own fields have no default")
    return filled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("file", type=Path, help="config.pbtxt template")
    parser.add_argument(
        "substitutions", help='comma-separated key:value pairs, e.g. "engine_dir:/e,device:cpu"'
    )
    parser.add_argument("-i", "--in-place", action="store_true", help="rewrite the file instead of printing")
    args = parser.parse_args(argv)
    try:
        filled = fill(args.file.read_text(), parse_substitutions(args.substitutions))
        if args.in_place:
            args.file.write_text(filled)
    except (OSError, ValueError) as e:  # OSError: a missing or unreadable file, a read-only one with -i
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not args.in_place:
        sys.stdout.write(filled)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
