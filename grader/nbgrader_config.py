"""nbgrader configuration of the distlab course.

``python -m grader`` loads this file and sets ``CourseDirectory.root`` itself (default
grader/course/). The grade of every test cell comes from ``TrustedExecute``: the student's answer
cells are run by trusted code on fresh rank processes, never in the student's kernel.
"""

from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import (
    AssignLatePenalties,
    CheckCellMetadata,
    ClearHiddenTests,
    ClearOutput,
    GetGrades,
    IgnorePattern,
    LimitOutput,
    OverwriteKernelspec,
    SaveAutoGrades,
)

from distlab.grading.nbgrader_hooks import DropDuplicateIds, RestoreDeletedTests, TrustedExecute

c = get_config()  # type: ignore[name-defined]  # noqa: F821 - provided by traitlets when it loads this file

c.CourseDirectory.course_id = "distlab"

# nbgrader's Execute (the student's kernel) is replaced by checks in fresh processes
c.Autograde.autograde_preprocessors = [
    TrustedExecute,
    IgnorePattern,
    ClearMetadataPreprocessor,
    LimitOutput,
    SaveAutoGrades,
    AssignLatePenalties,
    CheckCellMetadata,
]
c.TrustedExecute.part_timeout = 30.0
# edited test cells are restored from the instructor's copy; deleted ones are put back and graded
c.Autograde.sanitize_preprocessors = [
    ClearOutput,
    DropDuplicateIds,  # a pasted copy of a graded cell: the last copy is graded, as nbgrader intends
    OverwriteKernelspec,
    RestoreDeletedTests,
    CheckCellMetadata,
]
c.RestoreDeletedTests.add_missing_cells = True
# feedback shows why a part failed, never the hidden test code
c.GenerateFeedback.preprocessors = [GetGrades, ClearHiddenTests, CSSHTMLHeaderPreprocessor]
# in-kernel runs (nbgrader validate, the visible tests) start rank processes: give them time
c.Execute.timeout = 300
