"""Available vs achieved: what each worker held when the router chose, what the request got,
and why the difference (avoidable prefill tokens) was lost."""
