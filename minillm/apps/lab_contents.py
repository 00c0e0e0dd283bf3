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

import contextvars
import errno
import os
import posixpath
import shutil
import unicodedata
import urllib.parse

from jupyter_server.files.handlers import FilesHandler
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from tornado import web
from traitlets import default

#: Top-level folders of the served root that the lab neither lists nor serves.
HIDDEN_FOLDERS = ("tests",)
#: True while a folder is being listed: an entry leading into a hidden folder is then skipped
#: (jupyter_server skips entries whose ``get`` raises EACCES) instead of failing the listing.
_LISTING = contextvars.ContextVar("minillm_lab_listing", default=False)


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
    # compared as a case- and normalisation-insensitive file system would (macOS, Windows)
    first = unicodedata.normalize("NFC", parts[0]).casefold() if parts else ""
    return bool(parts) and (first in HIDDEN_FOLDERS or first == "..")


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
        if self._leads_into_hidden(os_path):
            raise web.HTTPError(404, f"No such file or directory: {path}")
        return os_path

    def _leads_into_hidden(self, os_path: str) -> bool:
        """True when ``os_path``, symlinks followed, is a hidden folder or inside one: by its
        name, and by the folder itself (device and inode of each parent up to the root), so
        that ``TESTS`` on a case-insensitive file system is ``tests`` too."""
        real, root = os.path.realpath(os_path), os.path.realpath(self.root_dir)
        rel = os.path.relpath(real, root).replace(os.sep, "/")
        if rel.startswith("../") or rel == "..":
            return False  # a link of the owner's to a folder outside the root: theirs to follow
        if is_course_hidden(rel):
            return True
        hidden = set()
        for name in HIDDEN_FOLDERS:
            try:
                st = os.stat(os.path.join(root, name))
                hidden.add((st.st_dev, st.st_ino))
            except OSError:
                pass
        while hidden and real != root and real.startswith(root + os.sep):
            try:
                st = os.stat(real)
            except OSError:
                st = None
            if st is not None and (st.st_dev, st.st_ino) in hidden:
                return True
            real = os.path.dirname(real)
        return False

    async def _copy_dir(self, from_path, to_path_original, to_name, to_path):
        # jupyter_server copies a folder with shutil.copytree, which follows symlinks and took
        # the root's tests/ along (copying "/" put the answers in a visible folder, and copied
        # the copy into itself until the path was too long): hidden entries are left out, and
        # a folder is never copied into itself.
        os_from = self._get_os_path(from_path.strip("/"))
        os_parent = self._get_os_path(to_path_original.strip("/"))
        real_from, real_parent = os.path.realpath(os_from), os.path.realpath(os_parent)
        if real_parent == real_from or real_parent.startswith(real_from + os.sep):
            raise web.HTTPError(400, f"Can't copy '{from_path}' into itself")
        try:
            shutil.copytree(os_from, os.path.join(os_parent, to_name), ignore=self._hidden_entries)
        except OSError as err:
            raise web.HTTPError(400, f"Can't copy '{from_path}' into '{to_path}': {err}") from None
        return await self.get(to_path, content=False)

    def _hidden_entries(self, folder: str, names: list[str]) -> set[str]:
        return {n for n in names if self._leads_into_hidden(os.path.join(folder, n))}

    def should_list(self, name):
        # A folder listing asks by name only; a "tests" folder deeper down is left out of the
        # listing too (there is none in the course), but only the top-level one is refused below.
        return name not in HIDDEN_FOLDERS and super().should_list(name)

    async def is_hidden(self, path):
        return is_course_hidden(path) or await super().is_hidden(path)

    async def get(self, path, content=True, type=None, format=None, require_hash=False):
        if is_course_hidden(path):
            raise web.HTTPError(404, f"No such file or directory: {path}")
        try:
            return await super().get(path, content=content, type=type, format=format, require_hash=require_hash)
        except web.HTTPError as exc:
            if _LISTING.get() and exc.status_code == 404:
                raise OSError(errno.EACCES, "hidden") from None  # a link into tests/: not listed
            raise

    # Checkpoints are found by their own path arithmetic (listing one made a folder inside
    # tests/): the same check first.
    async def create_checkpoint(self, path):
        self._get_os_path(path)
        return await super().create_checkpoint(path)

    async def list_checkpoints(self, path):
        self._get_os_path(path)
        return await super().list_checkpoints(path)

    async def restore_checkpoint(self, checkpoint_id, path):
        self._get_os_path(path)
        return await super().restore_checkpoint(checkpoint_id, path)

    async def delete_checkpoint(self, checkpoint_id, path):
        self._get_os_path(path)
        return await super().delete_checkpoint(checkpoint_id, path)

    async def _dir_model(self, path, content=True):
        token = _LISTING.set(True)
        try:
            return await super()._dir_model(path, content=content)
        finally:
            _LISTING.reset(token)

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
