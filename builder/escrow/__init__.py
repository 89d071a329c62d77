"""Every input of a recorded build kept beside its image (`build escrow`): the inventory of what
the record set names (sources by commit, wheels and .debs by sha256, bases by digest, the CPython
tarball, the recipe files), its bytes pushed as content-addressed OCI artifacts, the signed escrow
manifest that maps each input to its escrow digest, the check `build verify` makes of it, and the
download `build reproduce --from-escrow` rebuilds from (a fresh cache filled from it, each file
held to the record's pin).

May import: config, engine, source, deps, records.
"""
