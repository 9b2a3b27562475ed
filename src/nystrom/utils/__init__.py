"""Runtime helpers below every op and layer: input checks (``checks``), autocast (``amp``), the CPU/accelerator
path predicate (``device``), the CPU thread pool and range chunks (``parallel``), huge-page buffers
(``memory``) and CUDA-graph replay of a model's forward (``graphs``). They import nothing else of ours."""
