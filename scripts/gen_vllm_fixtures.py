#!/usr/bin/env python3
"""Writes the pull-message fixtures under tests/fixtures/vllm_gen3/.

Each fixture is one decoder -> prefiller pull message (vLLM's
MooncakeXferMetadata, "generation 3": per-group block ids, per-region
block_lens / kv_block_lens, layer names / indices / groups, the decoder's PP
size) encoded with msgspec exactly as a vLLM decoder worker encodes it, and
stored as one line of lowercase hex.

The struct below is declared here (not imported from vLLM) with the field
names, order, types, defaults and struct options of vLLM's definition; see
tests/fixtures/vllm_gen3/README.md for the commit it was read from.

    pip install msgspec
    python3 scripts/gen_vllm_fixtures.py          # rewrite the fixtures
    python3 scripts/gen_vllm_fixtures.py --check  # fail if any differs
"""
import argparse
import pathlib
import sys

import msgspec

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm_gen3"

HOST = "10.0.0.7"
PORT = 17000
BASE = 0x7F00_0000_0000
STRIDE = 0x10_0000


class MooncakeXferMetadata(msgspec.Struct, omit_defaults=True):
    """Decoder -> prefiller. A msgpack map keyed by field name (msgspec's
    default, not array_like); fields equal to their default (including the
    empty lists / dict of default_factory fields) are left out."""

    remote_hostname: str
    remote_port: int
    remote_tp_size: int
    remote_tp_rank: int
    # decoder request id -> (transfer id, block ids per KV-cache group)
    req_blocks: dict[str, tuple[str, list[list[int]]]]
    kv_caches_base_addr: list[int]
    block_lens: list[int]
    kv_block_lens: list[int]
    registered_layer_names: list[str] = msgspec.field(default_factory=list)
    registered_layer_indices: list[int] = msgspec.field(default_factory=list)
    registered_group_indices: list[int] = msgspec.field(default_factory=list)
    remote_pp_size: int = 1
    # Prefill-side replay handshake (unused by these fixtures: always left
    # out on the wire at their defaults).
    prefix_replay_protocol: int = 0
    prefix_replay_layout: str | None = None
    prefix_replay_checkpoints: dict[str, tuple[int, int, str]] = msgspec.field(
        default_factory=dict
    )


class MooncakeXferResponse(msgspec.Struct, omit_defaults=True):
    """Prefiller -> decoder (declared for reference; status 0 FINISH,
    1 CONTINUE, 2 ERROR)."""

    status: int
    ok_reqs: list[str] | None = None
    err_reqs: list[str] | None = None
    err_msg: str | None = None
    prefix_replay_checkpoints: dict[str, tuple[int, str]] | None = None


def layer(i: int) -> str:
    return f"model.layers.{i}.self_attn.attn"


def pull(
    *,
    tp_size: int,
    tp_rank: int,
    layers: list[int],
    block_len: int,
    blocks: list[list[int]],
    pp_size: int = 1,
    groups: list[int] | None = None,
    block_lens: list[int] | None = None,
    bases: list[int] | None = None,
) -> MooncakeXferMetadata:
    """One request ("d-1", transfer "xfer-1") from a decoder worker whose
    regions are `layers` (one region per layer, base BASE + i * STRIDE)."""
    n = len(layers)
    lens = block_lens if block_lens is not None else [block_len] * n
    return MooncakeXferMetadata(
        remote_hostname=HOST,
        remote_port=PORT,
        remote_tp_size=tp_size,
        remote_tp_rank=tp_rank,
        req_blocks={"d-1": ("xfer-1", blocks)},
        kv_caches_base_addr=bases if bases is not None else [BASE + i * STRIDE for i in layers],
        block_lens=lens,
        kv_block_lens=list(lens),
        registered_layer_names=[layer(i) for i in layers],
        registered_layer_indices=list(layers),
        registered_group_indices=groups if groups is not None else [0] * n,
        remote_pp_size=pp_size,
    )


def fixtures() -> dict[str, MooncakeXferMetadata]:
    # Hybrid: layers 0, 2 in group 0 (4096-byte blocks), 1, 3 in group 1
    # (8192); layer 3 is a view of layer 1's storage (same base).
    hybrid_bases = [BASE + i * STRIDE for i in range(4)]
    hybrid_bases[3] = hybrid_bases[1]
    return {
        "pp_d2_stage1": pull(
            tp_size=1, tp_rank=0, pp_size=2, layers=[2, 3],
            block_len=4096, blocks=[[5, 6, 7]],
        ),
        "pp_d1_full": pull(
            tp_size=1, tp_rank=0, layers=[0, 1, 2, 3],
            block_len=4096, blocks=[[5, 6, 7]],
        ),
        "mla_d_tp1": pull(
            tp_size=1, tp_rank=0, layers=[0, 1, 2],
            block_len=1152, blocks=[[1, 2]],
        ),
        "mla_d_tp2_rank1": pull(
            tp_size=2, tp_rank=1, layers=[0, 1, 2],
            block_len=1152, blocks=[[1, 2]],
        ),
        "replicated_d_tp2_rank1": pull(
            tp_size=2, tp_rank=1, layers=[0, 1],
            block_len=2048, blocks=[[3]],
        ),
        "hybrid_two_groups": pull(
            tp_size=1, tp_rank=0, layers=[0, 1, 2, 3],
            block_len=4096, block_lens=[4096, 8192, 4096, 8192],
            groups=[0, 1, 0, 1], bases=hybrid_bases,
            blocks=[[10, 11, 12, 13], [20, 21]],
        ),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare, do not write")
    args = ap.parse_args()
    enc = msgspec.msgpack.Encoder()
    dec = msgspec.msgpack.Decoder(MooncakeXferMetadata)
    raw = msgspec.msgpack.Decoder()
    stale = []
    OUT.mkdir(parents=True, exist_ok=True)
    for name, msg in fixtures().items():
        data = enc.encode(msg)
        assert dec.decode(data) == msg, name
        keys = list(raw.decode(data))
        assert ("remote_pp_size" in keys) == (msg.remote_pp_size != 1), name
        assert not any(k.startswith("prefix_replay") for k in keys), name
        text = data.hex() + "\n"
        path = OUT / f"{name}.hex"
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
        print(f"{name}: {len(data)} bytes, {len(keys)} keys")
    if stale:
        print("stale fixtures: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
