"""Infera engine plugin for OpenAI-API servers: llama.cpp, TGI, TensorRT-LLM, Triton, any command."""

__version__ = "0.1.0"
