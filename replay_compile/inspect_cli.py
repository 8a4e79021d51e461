"""``replayssm inspect FILE.py:FUNCTION``: print what the replayssm backend rewrites in FUNCTION.

The file is imported as a module. FUNCTION may be a function, an ``nn.Module`` instance or an
``nn.Module`` class (instantiated without arguments). Its example call comes from a callable in the
same file: ``--inputs NAME``, else ``FUNCTION_inputs``, else ``example_inputs``; it returns the
positional arguments as a tuple, keyword arguments as a dict, or ``(args, kwargs)``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch


def _load(path: str):
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"replayssm inspect: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def _example_call(module, fn_name: str, inputs_name):
    names = [inputs_name] if inputs_name else [f"{fn_name}_inputs", "example_inputs"]
    for name in names:
        make = getattr(module, name, None)
        if callable(make):
            got = make()
            if isinstance(got, dict):
                return (), got
            if isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], tuple) and isinstance(got[1], dict):
                return got
            return tuple(got) if isinstance(got, (tuple, list)) else (got,), {}
    raise SystemExit(f"replayssm inspect: no example inputs: define {' or '.join(names)}() in the file")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="replayssm inspect", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="path/to/file.py:function")
    parser.add_argument("--options", default="{}", help="backend options as JSON, e.g. '{\"window\": 8}'")
    parser.add_argument("--inputs", default=None, help="name of the example-inputs callable in the file")
    args = parser.parse_args(argv)
    path, sep, fn_name = args.target.rpartition(":")
    if not sep or not path or not fn_name:
        parser.error("target must look like path/to/file.py:function")
    module = _load(path)
    fn = getattr(module, fn_name, None)
    if fn is None:
        parser.error(f"{path} defines no {fn_name!r}")
    if isinstance(fn, type) and issubclass(fn, torch.nn.Module):
        fn = fn()
    call_args, call_kwargs = _example_call(module, fn_name, args.inputs)
    from .api import explain
    print(explain(fn, *call_args, options=json.loads(args.options), **call_kwargs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
