"""The Dockerfile as a pure function of a target: the Jinja template (StrictUndefined, labels
last), the scripts it copies into the build context, and the compile cache's settings.

May import: config.
"""
