"""The browser suite: JupyterLab driven by Chromium, as a learner uses the kit."""
