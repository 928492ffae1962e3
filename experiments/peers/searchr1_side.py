"""Search-R1's retrieval server on CPU, for experiments/bench_serve.py, run in the peers environment:

    <peers python> experiments/peers/searchr1_side.py \
        <Search-R1 clone>/search_r1/search/retrieval_server.py PORT \
        --index_path ... --corpus_path ... --retriever_name minilm --retriever_model ... --topk 5

Runs the server file by path (``runpy``: its ``__main__`` block, its argparse, its globals), with two changes
made here at run time and nothing else: torch's ``.cuda()`` (``Module.cuda`` and ``Tensor.cuda``) returns its
object, so its ``model.cuda()`` and ``{k: v.cuda()}`` keep the CPU (``torch.cuda.empty_cache`` is already a
no-op without CUDA); and its ``uvicorn.run(app, host="0.0.0.0", port=8000)`` listens on 127.0.0.1 at PORT,
so the bench neither opens a port to the network nor collides with another server on 8000. Its code is not
copied: the file is read from the clone given.
"""

import runpy
import sys

import torch
import uvicorn


def main() -> None:
    path, port, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    torch.nn.Module.cuda = lambda self, device=None: self
    torch.Tensor.cuda = lambda self, *a, **k: self
    serve = uvicorn.run
    uvicorn.run = lambda app, *a, **k: serve(app, **(k | {"host": "127.0.0.1", "port": port}))
    sys.argv = [path, *args]
    runpy.run_path(path, run_name="__main__")


if __name__ == "__main__":
    main()
