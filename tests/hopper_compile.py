"""Every Triton kernel of ours that a test launches in Triton's interpreter must also compile for the H200.

The interpreter runs code that Triton's compiler refuses (a name typed differently in two branches of an
``if``, a loop-carried value that changes type, a plain Python global), so kernels that pass every test
on CI failed to build on the H200, three times in one kernel. Without a GPU the compiler still runs: it
builds a cubin for sm_90 from the kernel's signature, and says how much shared memory a program needs
(more than an SM has fails only at launch). :class:`Launches` notes the signature of each
launch of a ``trtllm_bole`` kernel in the interpreter (argument types, constexpr values, launch options)
and :class:`Compiler` builds each new one in a process of its own (where ``@triton.jit`` makes compilable
functions, not interpreted ones); ``tests/conftest.py`` fails the test that launched a kernel that does
not build. A specialisation on an argument's value (an integer equal to 1) still shows only on a GPU.

Run as a script, this file is that process: a JSON launch a line in, a JSON verdict a line out.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

POINTEE = {
    "float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64", "int64": "i64",
    "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1",
}  # fmt: skip
"""The compiler's name of the element type a tensor argument points to, by torch's dtype name."""


def argument_type(value: Any) -> str:
    """The compiler's type of a runtime argument's value."""
    if hasattr(value, "data_ptr"):
        return "*" + POINTEE[str(value.dtype).removeprefix("torch.")]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no compiler type for an argument of type {type(value).__name__}")


def launch(fn, args: tuple, kwargs: dict) -> dict:
    """A launch of the interpreted kernel function ``fn`` as the compiler takes it: its signature (every
    parameter's type, ``constexpr`` for compile-time ones), the constexpr values and the launch options
    (``num_warps``, ...)."""
    params = inspect.signature(fn).parameters
    bound = dict(zip(params, args, strict=False)) | {k: v for k, v in kwargs.items() if k in params}
    signature, constexprs = {}, {}
    for name, param in params.items():
        value = bound.get(name, param.default)
        if "constexpr" in str(param.annotation) or value is None:
            signature[name], constexprs[name] = "constexpr", value
        else:
            signature[name] = argument_type(value)
    options = {k: v for k, v in kwargs.items() if k not in params}
    return {"module": fn.__module__, "name": fn.__name__, "signature": signature, "constexprs": constexprs,
            "options": options}  # fmt: skip


class Launches:
    """Notes each new launch of a ``trtllm_bole`` kernel in the interpreter, from :meth:`install` on."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.new: list[dict] = []

    def install(self) -> None:
        from triton.runtime.interpreter import InterpretedFunction

        run = InterpretedFunction.run
        launches = self

        def noting(self, *args, grid, warmup, **kwargs):
            if self.fn.__module__.startswith("trtllm_bole."):
                launches.note(launch(self.fn, args, kwargs))
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)

        InterpretedFunction.run = noting

    def note(self, record: dict) -> None:
        key = json.dumps(record, sort_keys=True, default=repr)
        if key not in self.seen:
            self.seen.add(key)
            self.new.append(record)

    def take(self) -> list[dict]:
        new, self.new = self.new, []
        return new


class Compiler:
    """This file run as a script in a process without ``TRITON_INTERPRET``, started at the first launch."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None

    def failures(self, launches: list[dict]) -> list[str]:
        """What the compiler said of each launch that does not build."""
        if launches and self.process is None:
            env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
            self.process = subprocess.Popen(
                [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
            )
        failed = []
        for record in launches:
            self.process.stdin.write(json.dumps(record, default=repr) + "\n")
            self.process.stdin.flush()
            verdict = json.loads(self.process.stdout.readline() or '{"error": "the compiler process died"}')
            if "error" in verdict:
                failed.append(f"{record['module']}.{record['name']} {record['signature']} "
                              f"{record['constexprs']}: {verdict['error']}")  # fmt: skip
        return failed

    def close(self) -> None:
        if self.process is not None:
            self.process.stdin.close()
            self.process.wait(timeout=60)
            self.process = None


def _causes(error: BaseException | None) -> str:
    """The error and what caused it, the first cause first (Triton's names the line at each call level)."""
    chain = []
    while error is not None:
        chain.append(f"{type(error).__name__}: {error}"[:1500])
        error = error.__cause__
    return "\n".join(reversed(chain))


HOPPER_SHARED = 232_448
"""Shared memory one program may take on an H200 SM (227 KB, the opt-in maximum)."""


def serve() -> None:
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    hopper = GPUTarget("cuda", 90, 32)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' own modules import too
    for line in sys.stdin:
        record = json.loads(line)
        try:
            fn = getattr(importlib.import_module(record["module"]), record["name"])
            source = ASTSource(fn, record["signature"], constexprs=record["constexprs"])
            shared = triton.compile(source, target=hopper, options=record["options"]).metadata.shared
            verdict = {"ok": True}
            if shared > HOPPER_SHARED:
                limit = f"past the {HOPPER_SHARED} an H200 SM offers (its launch fails: OutOfResources)"
                verdict = {"error": f"needs {shared} bytes of shared memory a program, {limit}"}
        except Exception as error:  # any compile error is the verdict
            verdict = {"error": _causes(error)}
        print(json.dumps(verdict), flush=True)


if __name__ == "__main__":
    serve()
