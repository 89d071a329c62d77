"""The build and its orchestration: what a build reads (plan), the build step by step and
`build reproduce`, and the diff of two images. (The smoke target is builder/smoke/.)

May import: config, engine, dockerfile, source, deps, checks, records.
"""
