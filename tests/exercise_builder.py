"""``scripts/build_exercises.py`` (repo-only, not in the package) loaded once for the tests that
compare the committed exercises notebooks with what it writes."""

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "build_exercises.py"
_spec = importlib.util.spec_from_file_location("build_exercises", _PATH)
builder = sys.modules.get("build_exercises") or importlib.util.module_from_spec(_spec)
if "build_exercises" not in sys.modules:
    sys.modules["build_exercises"] = builder
    _spec.loader.exec_module(builder)

SOLVED, SOLVED_ZH, STUDENT, STUDENT_ZH = builder.SOLVED, builder.SOLVED_ZH, builder.STUDENT, builder.STUDENT_ZH
TARGETS, build, solved_answers = builder.TARGETS, builder.build, builder.solved_answers
