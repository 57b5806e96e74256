"""Two kinds of publication for tests/unified/test_publish.py, and the processes it runs.

:class:`Notes` publishes two files (``text``, linked, and ``meta`` beside it), :class:`Folder` one
directory; each file they write carries :data:`MARK` and the generation's value, so a reader can tell a
whole generation from a mix and the sweep can tell ours from a user's.

``python publish_child.py KIND PATH VALUE CONTENTION [TIMEOUT]``: publish ``VALUE`` at ``PATH`` (``KIND``
``notes`` or ``folder``) and say ``published``.
"""

import os
import sys
from pathlib import Path

from directload.publish import Publication

MARK = "directload-publish-test"


def _ours(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().startswith(MARK)
    except (OSError, UnicodeDecodeError):
        return False


class Notes(Publication):
    """A generation of two files: ``notes.g<N>`` (the link names it) and ``notes.g<N>.meta``."""

    roles = {"text": "", "meta": ".meta"}
    required = ("meta",)

    def owns(self, path, role):
        return _ours(path)

    def adopts(self, path):
        return path.is_file() and _ours(path)  # a file of ours written in place, before generations


class Folder(Publication):
    """A generation that is one directory holding ``record`` and ``rows``."""

    roles = {"set": ""}
    directory_roles = frozenset({"set"})
    label = "folder:"

    def owns(self, path, role):
        return _ours(path / "record")

    def adopts(self, path):
        return path.is_dir() and (not any(path.iterdir()) or _ours(path / "legacy"))


def publish(kind, path, value, **options):
    """Publish generation ``value`` at ``path``."""
    text = f"{MARK} {value}\n"
    if kind == "notes":
        with Notes(path, **options) as p:
            with p.create("text", "w") as f:
                f.write(text)
            p.step("half")
            with p.create("meta", "w") as f:
                f.write(text)
            p.commit()
        return
    with Folder(path, **options) as p:
        where = p.build("set")
        (where / "rows").write_text(text)
        p.step("rows")
        (where / "record").write_text(text)  # last: ours from here
        p.step("record")
        p.commit()


def read(kind, path):
    """The value of the whole generation at ``path``; AssertionError for a mix or anything else."""
    path = Path(path)
    if kind == "folder":
        parts = [path / "rows", path / "record"] if path.is_symlink() else [path / "legacy"]
    else:
        parts = [path, Path(str(path.parent / os.readlink(path)) + ".meta")] if path.is_symlink() else [path]
    values = {p.read_text(encoding="utf-8") for p in parts}
    assert len(values) == 1, f"a mix at {path}: {values}"
    text = values.pop()
    assert text.startswith(MARK), text
    return int(text.split()[1])


def main(args):
    kind, path, value, contention = args[:4]
    timeout = float(args[4]) if len(args) > 4 else None
    publish(kind, path, int(value), contention=contention, timeout=timeout)
    print("published", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
