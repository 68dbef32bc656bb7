"""Test and benchmark infrastructure, out of the product's path: a loopback SGLang-compatible server
(loopback_server) and a tiny Qwen3 model with its tokenizer built on this machine (tiny_model, also the demo's
default model since nothing can be downloaded here).
"""
