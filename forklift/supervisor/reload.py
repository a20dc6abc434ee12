"""Fresh code for a rolling reload: forget the app's own modules and import it again."""

from __future__ import annotations

import gc
import logging
import os
import sys
import sysconfig
from collections.abc import Callable

import forklift
from forklift import _loading
from forklift.app import App

log = logging.getLogger(__name__)


def _protected_dirs() -> list[str]:
    dirs = {os.path.dirname(os.path.abspath(forklift.__file__))}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(os.path.abspath(path))
    dirs.update(os.path.abspath(p) for p in (sys.prefix, sys.base_prefix))
    return sorted(dirs)


def reimport(target: str) -> App:
    """Import MODULE:APP again, after dropping every module loaded from the app's tree.

    Libraries (stdlib, site-packages) and forklift itself stay loaded; the app's own
    modules under the directory of its top-level package are imported afresh.
    """
    top = target.partition(":")[0].split(".")[0]
    module = sys.modules.get(top)
    top_file = getattr(module, "__file__", None)
    if top_file:
        root = os.path.dirname(os.path.abspath(top_file))
        if os.path.basename(top_file) == "__init__.py":
            root = os.path.dirname(root)
        protected = _protected_dirs()
        for name, mod in list(sys.modules.items()):
            path = getattr(mod, "__file__", None)
            if not path:
                continue
            path = os.path.abspath(path)
            if path.startswith(root + os.sep) and not any(
                path.startswith(p + os.sep) for p in protected
            ):
                del sys.modules[name]
    return _loading.load_app(target)


def import_again(
    target: str, reimport: Callable[[str], App], in_fork_server: Callable[[], bool]
) -> App | None:
    """The app at `target` imported again, here and in the fork server (whose next
    children run it); None, said, if either import failed: the children keep the
    running code."""
    try:
        app = reimport(target)
    except Exception:
        log.exception("reload: importing %s failed; children keep the running code", target)
        return None
    if not in_fork_server():
        return None
    gc.collect()
    return app
