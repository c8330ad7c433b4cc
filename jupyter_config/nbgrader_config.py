# nbgrader as the learner meets it in `make lab`: only the Validate button, on the learner's own
# kernel. The instructor's screens (Formgrader, Assignment List, Course List, Create Assignment)
# are switched off here (jupyter_server_config.json, labconfig/page_config.json): the kit's one
# instructor path is `python -m grader` (grader/README.md), which uses grader/nbgrader_config.py.
c = get_config()  # noqa: F821
c.Execute.timeout = 300  # a %%dist cell starts ranks: more than nbgrader's default 30 s per cell
