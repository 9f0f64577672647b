"""The in-process llama.cpp backend: the only place that imports llama_cpp (its bindings and native library).

  llama.py       `LlamaBackend`: one worker thread, its own decode loop, prefix reuse, branches
  llamacpp.py    thin wrappers over llama.cpp's C API: batch, decode, KV cache, sampler chain
  chain.py       the sampler chain built with llama.cpp's samplers (the plan is ../stages.py)
  grammar.py     an output format enforced by LLGuidance; gbnf.py writes JSON as GBNF for a llama.cpp server
  xray.py        why a token was drawn, stage by stage; the exact probability of any text
  kvstore.py     KV states on disk (files, keys, checks, the budget); kvcache.py when a turn restores or saves one
  cpu.py         threads that fit the machine and its load; cpu_path.py, probe.py the AMX self-test
  ggml.py        what the build can do: CPU features, devices; logs.py llama.cpp's log to a file

Nothing is imported here: the config names the CPU paths (cpu_path.py) at every start, without llama.cpp.
"""
