"""Talking to inference servers: vLLM, SGLang, or any OpenAI-compatible one."""
