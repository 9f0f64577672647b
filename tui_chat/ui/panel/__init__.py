"""The side panel: what the model is doing (metrics.py: TTFT, rates, tokens, KV, cost) and the sampling that
drives it (sampling.py, with its controls: slider, order, bias, output_format). Widgets like those of ../widgets/:
given what they show, posting what the user did."""
