"""The help of the project's command lines (``python -m trtllm_bole generate``, ``build_engine.py``)."""

from __future__ import annotations

import argparse


class HelpWithDefaults(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks and shows each option's default: a list as ``N,N,...``; none for
    a flag, or where the default is ``None`` (those options say in their help what unset means)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        default = action.default
        if default is None or isinstance(default, bool) or default is argparse.SUPPRESS:
            return action.help
        shown = ",".join(map(str, default)) if isinstance(default, tuple | list) else str(default)
        return f"{action.help or ''} (default: {shown.replace('%', '%%')})".lstrip()
