"""The contents manager ``minillm lab`` gives JupyterLab: the course, without the instructor's files.

The lab serves the repository root (notebooks/, exercises/, the engine's source to read), but
``tests/`` holds the solved exercise notebook (``tests/solved/``) and the grader's answers. A
learner must not find them in the file browser or open them by typing a URL, so every path
under a folder in ``HIDDEN_FOLDERS`` is treated like a hidden file: not listed, and answered
with 404 by the contents API, ``/files/`` and anything else that reads through this manager.
The check is made on the path as the file system will resolve it (``..`` collapsed, percent
escapes undone, symlinks followed), in reads and writes alike: ``notebooks/%2e%2e/tests/...``,
``exercises/../tests`` or a link into ``tests/`` are refused like ``tests/`` itself, and a path
climbing out of the served folder is refused too. (This keeps the answers out of the file
browser and the URLs; a notebook's kernel runs code as the learner and can read any file they can.)

It also keeps "Notebook … is not trusted" out of the terminal: every course notebook opened
for the first time is untrusted (that is what trust means), so the warning would repeat for
each one and say nothing useful. It is logged at debug level instead.

Imported only inside the JupyterLab server process (``--ServerApp.contents_manager_class``).
"""

from __future__ import annotations

import os
import posixpath
import urllib.parse

from jupyter_server.files.handlers import FilesHandler
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from tornado import web
from traitlets import default

#: Top-level folders of the served root that the lab neither lists nor serves.
HIDDEN_FOLDERS = ("tests",)


def normal_api_path(path: str) -> str:
    """``path`` as the file system sees it: percent escapes undone (repeatedly: ``%252e`` too),
    backslashes as slashes, ``.`` and ``..`` collapsed; a path that climbs out of the root keeps
    its leading ``..``."""
    text = str(path)
    for _ in range(4):
        decoded = urllib.parse.unquote(text)
        if decoded == text:
            break
        text = decoded
    text = text.replace("\\", "/").lstrip("/")
    return posixpath.normpath(text) if text else ""


def is_course_hidden(path: str) -> bool:
    """True for ``tests``, ``tests/solved/x.ipynb``, ``/tests/``, ``notebooks/../tests``,
    ``notebooks/%2e%2e/tests``: anything in a hidden folder, or outside the served root."""
    parts = [p for p in normal_api_path(path).split("/") if p not in ("", ".")]
    return bool(parts) and (parts[0] in HIDDEN_FOLDERS or parts[0] == "..")


class CourseContentsManager(AsyncLargeFileManager):
    """``AsyncLargeFileManager`` (JupyterLab's default) that hides ``HIDDEN_FOLDERS``."""

    @default("files_handler_class")
    def _files_handler_class_default(self):
        # The file manager's own default serves /files/ straight from the disk, asking only
        # whether a name starts with a dot; this handler reads through the manager instead.
        return FilesHandler

    @default("files_handler_params")
    def _files_handler_params_default(self):
        return {"path": self.root_dir}  # StaticFileHandler wants one; FilesHandler reads via get()

    def _get_os_path(self, path):
        # Every read, write, rename and delete of the file manager comes through here: check
        # where the path really leads (``..`` collapsed, symlinks followed), not its words. A
        # symlink the owner made to a folder outside the root is theirs to follow, as before.
        if is_course_hidden(path):
            raise web.HTTPError(404, f"No such file or directory: {path}")
        os_path = super()._get_os_path(path)  # 404 for anything outside the root
        rel = os.path.relpath(os.path.realpath(os_path), os.path.realpath(self.root_dir)).replace(os.sep, "/")
        if not rel.startswith("../") and is_course_hidden(rel):
            raise web.HTTPError(404, f"No such file or directory: {path}")
        return os_path

    def should_list(self, name):
        # A folder listing asks by name only; a "tests" folder deeper down is left out of the
        # listing too (there is none in the course), but only the top-level one is refused below.
        return name not in HIDDEN_FOLDERS and super().should_list(name)

    async def is_hidden(self, path):
        return is_course_hidden(path) or await super().is_hidden(path)

    async def get(self, path, content=True, type=None, format=None, require_hash=False):
        if is_course_hidden(path):
            raise web.HTTPError(404, f"No such file or directory: {path}")
        return await super().get(path, content=content, type=type, format=format, require_hash=require_hash)

    async def file_exists(self, path):
        try:
            return not is_course_hidden(path) and await super().file_exists(path)
        except web.HTTPError:  # refused by _get_os_path: as if it did not exist
            return False

    async def dir_exists(self, path):
        try:
            return not is_course_hidden(path) and await super().dir_exists(path)
        except web.HTTPError:
            return False

    def mark_trusted_cells(self, nb, path=""):
        trusted = self.notary.check_signature(nb)
        if not trusted:
            self.log.debug("Notebook %s is not trusted", path)
        self.notary.mark_cells(nb, trusted)
