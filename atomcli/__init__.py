"""atomcli: composable stages for training LLM research agents (Atom-Searcher on DeepResearcher).

This file owns only the version, the one place it is written (pyproject.toml reads it from
here). Everything heavy (torch, transformers, trl) is imported inside the stage that needs it
so that `atom --help` stays fast.
"""

__version__ = "0.2.0"
