"""Models for the tacc stack, built as ONNX graphs (``tacc.models.gpt2``: a GPT-2-architecture
decoder with a static KV cache); they run through ``tacc.onnx`` (``tacc run decode``) and
``onnx.reference.ReferenceEvaluator`` (the check)."""
