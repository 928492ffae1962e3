"""The dense index encoded once a node (issue 72): two processes of one node build one dense retriever over a
shared cache; each shard's passages are encoded once in all (each process its share), and both processes
search exactly as one process alone does.

The processes are started by torch's elastic launcher (``torch.distributed.run``, torchrun), which is what
``accelerate launch`` runs for a job of several processes, and which sets ``LOCAL_RANK`` and
``LOCAL_WORLD_SIZE`` in each; started directly, without accelerate's command line (5 s of CPU to import on
its own), the test stays within its time on 2 cores."""

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from dense_node import CORPUS, QUERIES

from rag_lab.core.errors import RagLabError
from rag_lab.core.node import wait_for
from rag_lab.retrievers.dense import DenseRetriever, Encoder

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_of_a_node_encode_each_shard_once(tiny_encoder_dir, tmp_path):
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        str(HERE / "dense_node.py"),
        tiny_encoder_dir,
        str(tmp_path / "cache"),
        str(tmp_path),
    ]
    env = os.environ | {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(HERE.parent)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["node"] for r in ranks] == [["0", "2"], ["1", "2"]]
    passages = [f"T{i}\n{t}" for i, t in enumerate(CORPUS.texts)]
    # 8 passages in shards of 3: process 0 encodes shards 0 and 2, process 1 shard 1; none twice
    assert ranks[0]["passages"] == passages[:3] + passages[6:] and ranks[1]["passages"] == passages[3:6]
    assert Counter(ranks[0]["passages"] + ranks[1]["passages"]) == Counter(passages)
    alone = DenseRetriever(CORPUS, Encoder(tiny_encoder_dir), shard_size=3, show_progress=False)
    want = [[[h.id, h.score] for h in hits] for hits in alone.search(QUERIES, 4)]
    assert ranks[0]["hits"] == ranks[1]["hits"] == want


def test_a_process_waiting_for_its_node_stops_in_one_line(tmp_path):
    with pytest.raises(RagLabError, match=r"^what: process 0 of this node waited 0\.2 s .* none appeared"):
        wait_for([tmp_path / "never.npy"], "what", stall_s=0.2, poll_s=0.05)
