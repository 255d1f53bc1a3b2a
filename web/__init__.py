"""The cluster page: node health at a glance, GPU usage, one timeline, and the operators' node operations.

`serve(config_path, listen)` runs it (the controller agent's `web` worker, or `slurm-ext web` standalone) on
waitress; `create_app(config)` is the Flask app, over a `watch.Watcher` that reads the cluster once per refresh
for every browser. The assets (one HTML page, one script, one stylesheet) are package data: nothing is fetched
at run time, so the page works on an air-gapped cluster. Imported on first use: the core CLI loads `cli` for
every command, and Flask is only needed here.
"""

from slurm_ext.lazy import lazy_names

__all__ = ["serve", "create_app"]

_LAZY = {"serve": "server", "create_app": "app"}


__getattr__ = lazy_names(__name__, _LAZY)
