#!/usr/bin/env python3
"""Exports HF transformers BERT-base (BertConfig() defaults: 12 layers, hidden 768, 12 heads,
intermediate 3072, vocab 30522, SDPA attention) with random seeded weights as PT2 archives
(torch.export.save, training IR), inputs input_ids / attention_mask [B, 128] (static shapes, one
archive per batch), outputs (last_hidden_state, pooler_output). Exported on CUDA inputs (as
tests/data/pt2-2.11-extra/llama_cuda): exported on CPU, the lifted position_ids / token_type_ids
constants stay on the CPU in ep.module().to("cuda"), which PyTorch's own baseline cannot run. Run on the GPU machine with
PyTorch 2.11 + transformers: python3 bench/export_bert_base.py OUTDIR [--dtype float32|bfloat16]
[--batch 1,32] -> OUTDIR/bert_base_<dtype>_b<B>.train.pt2. Not committed (~420 MiB each)."""
import argparse, os, sys, time
import torch

# The wrapper the committed BERT programs were made with ((last_hidden_state, pooler_output)).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gen"))
from gen_pt2_extra import BertWrap  # noqa: E402


def main():
    from transformers import BertConfig, BertModel

    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", default="1,32")
    a = ap.parse_args()
    torch.manual_seed(0)
    cfg = BertConfig()
    cfg._attn_implementation = "sdpa"
    m = BertWrap(BertModel(cfg)).eval().to(getattr(torch, a.dtype)).cuda()
    for b in [int(x) for x in a.batch.split(",")]:
        ids = torch.randint(0, 30522, (b, 128), generator=torch.Generator().manual_seed(4)).cuda()
        mask = torch.ones(b, 128, dtype=torch.int64).cuda()
        t0 = time.time()
        ep = torch.export.export(m, (ids, mask))
        path = os.path.join(a.outdir, f"bert_base_{a.dtype}_b{b}.train.pt2")
        torch.export.save(ep, path)
        print(f"exported {path} in {time.time() - t0:.1f} s ({os.path.getsize(path) / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
