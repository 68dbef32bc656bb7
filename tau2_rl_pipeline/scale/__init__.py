"""Beyond one node and one model: presets, the sizing sheet and the cost on paper (stdlib only).

Beyond one node and one model: the model presets (presets: MODEL=..., RECIPE=...), the sizing sheet every stage
script prints and refuses by (sizing, reached from the scripts through cli), and the cost on paper (cost).

Stdlib only and nothing above the ground: a dry run on a laptop needs neither slime nor a GPU stack.
"""
