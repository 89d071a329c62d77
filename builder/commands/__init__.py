"""The subcommands of ``build``, one module each: each registers its own subparser (``register``)
and runs it (``run(args, out)``, returning the exit code or raising a BuilderError). ``parser``
puts them together in their order; ``_common`` holds what several share (the global options,
--target handling, the stdout document), ``_build_options`` and ``_accept_options`` the flags of
`build`/`reproduce` and of `accept`; ``reference`` writes the commands reference
(docs/reference/commands.md) from the parser. ``builder.cli`` parses with them and dispatches. The
commands parse and print: what a command decides lives in the package below it.

May import: config, engine, dockerfile, source, deps, checks, records, escrow, host, pipeline, accept, smoke.
"""
