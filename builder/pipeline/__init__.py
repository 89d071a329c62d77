"""The build and its orchestration: what a build reads (plan), the build step by step and
`build reproduce`, the smoke target's fixtures, and the diff of two images.

May import: config, engine, dockerfile, source, deps, checks, records.
"""
