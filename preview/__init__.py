"""Preview library: what a change to the fleet's files does to applied infrastructure, offline.

``synth`` synthesizes a git base and the working tree, ``diff`` compares the stacks resource by
resource with the ForceNew tables (``forcenew``, regenerated from the providers' Go source by
``regen``/``goschema``/``gosource``), ``report`` formats the result and ``service`` is the one
entry point ``gpufleet preview`` and ``gpufleet check`` call.
"""
