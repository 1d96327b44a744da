"""Review: what a pull request is judged by, composed from the layers below it.

``checks`` runs every gate of ``gpufleet check`` (input files, synthesis, secret scan, checkov,
destroys, the cheap preview) and ``ci_comment`` writes the one pull-request comment from the plan
gate's and the preview's results. The CLI's ``check`` and ``ci comment`` commands only parse,
call these and print.
"""
