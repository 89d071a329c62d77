"""What an auditor reads: the record set under locks/<target>/ written as one unit, the SBOM and
provenance, the DSSE signature, the inventory read out of an image, the registry signature
status, and `build verify`.

May import: config, engine, dockerfile, deps.
"""
