#!/usr/bin/env python3
"""Train hyspec's demo model family in one run on one GPU (see models/README.md).

What it does, in order, all from one seed:
  1. corpus     the Python standard library's .py sources of the interpreter running this script
                (PSF licence); ~2% of the files (by a hash of their path) are held out.
  2. tokenizer  byte-level BPE (HF `tokenizers`) with the qwen35 pre-tokenizer (QWEN35.md) and the
                Qwen special tokens, appended after the learned vocabulary.
  3. target     transformers' Qwen3_5ForCausalLM: 8 layers (Gated DeltaNet : gated attention = 3 : 1),
                partial RoPE 0.25, tied embeddings, bf16 autocast.
  4. MTP head   Qwen's nextn block (mtp.fc, mtp.pre_fc_norm_*, mtp.layers.0 = one full-attention
                decoder layer, mtp.norm) trained on the frozen target to reproduce the target's
                next-next-token distribution, for the first draft and one chained draft.
  5. DFlash     a z-lab-layout block-diffusion drafter (fc, hidden_norm, layers.*, norm; 2 layers)
                trained on the target's own greedy continuations: random anchors, block
                [anchor token, mask x 15], features of the tapped target layers as context.
  6. held-out   perplexity, and the greedy acceptance of both drafters simulated round by round.
Writes under --out (the device tool returns at most 8 files):
  target/model-0000k-of-0000N.safetensors, drafter/model.safetensors, meta.tar (config.json,
  tokenizer.json, tokenizer_config.json, model.safetensors.index.json of the target; config.json of
  the drafter; stats.json), losses.png, stats.json.

Usage: python3 train_demo.py --out DIR [--seed 1234] [--dry-run] [--fixtures DIR] [--chat-template FILE]
Python runs only on the GPU machine (no network: HF_HUB_OFFLINE is forced).
"""
import argparse
import glob
import hashlib
import io
import json
import math
import os
import struct
import sys
import sysconfig
import tarfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

QWEN35_PRETOKENIZER = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
    r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
            "<|mask|>"]
VOCAB = 8192

# The target: the real family's structure at ~19M parameters (Q8_0 about 20 MB).
TARGET = dict(hidden=384, layers=8, ffn=960, heads=8, kv_heads=2, head_dim=64,
              gdn_k_heads=3, gdn_v_heads=6, gdn_head_dim=64, conv_kernel=4, ctx=4096)
# The drafter: z-lab's DFlash layout (Qwen3 layers), 2 layers, taps spread over the target's depth.
DRAFT = dict(layers=2, heads=8, kv_heads=2, head_dim=64, ffn=960, block=16, taps=[1, 3, 5, 7])
EPS = 1e-6
ROPE_THETA = 1e7

T0 = time.time()
LOG = []
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the recipe is for a GPU; CPU only smoke-tests it


def amp():
    """bf16 autocast on the GPU (plain f32 elsewhere)."""
    return torch.autocast(DEV, dtype=torch.bfloat16, enabled=DEV == "cuda")


def log(msg):
    line = f"[{time.time() - T0:7.1f}s] {msg}"
    print(line, flush=True)
    LOG.append(line)


# ---------------------------------------------------------------------------------------------
# 1. Corpus
# ---------------------------------------------------------------------------------------------

# Packages of the interpreter's site-packages added to the standard library, with their licences.
# Each contributes at most PACKAGE_CAP bytes (its .py files in sorted order).
PACKAGES = [("numpy", "BSD-3-Clause"), ("scipy", "BSD-3-Clause"), ("sklearn", "BSD-3-Clause"),
            ("pandas", "BSD-3-Clause"), ("networkx", "BSD-3-Clause"), ("sympy", "BSD-3-Clause")]
PACKAGE_CAP = 10_000_000


def read_sources(root, paths, cap, label):
    docs, n_bytes = [], 0
    for p in paths:
        if n_bytes >= cap:
            break
        try:
            with open(p, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip() or len(text) > 400_000:
            continue
        rel = os.path.join(label, os.path.relpath(p, root))
        held_out = int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 50 == 0
        docs.append((rel, text, held_out))
        n_bytes += len(text.encode())
    return docs, n_bytes


def load_corpus():
    """The standard library's .py files (PSF-2.0) and those of a few BSD-licensed packages."""
    stdlib = sysconfig.get_paths()["stdlib"]
    paths = sorted(p for p in glob.glob(os.path.join(stdlib, "**", "*.py"), recursive=True)
                   if "site-packages" not in p and "dist-packages" not in p)
    docs, n_bytes = read_sources(stdlib, paths, float("inf"), "stdlib")
    parts = [{"name": "python-stdlib", "path": stdlib, "licence": "PSF-2.0", "files": len(docs), "bytes": n_bytes}]
    site = sysconfig.get_paths()["purelib"]
    for pkg, licence in PACKAGES:
        root = os.path.join(site, pkg)
        if not os.path.isdir(root):
            continue
        pd, pb = read_sources(root, sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)),
                              PACKAGE_CAP, pkg)
        version = "?"
        for info in glob.glob(os.path.join(site, pkg.replace("sklearn", "scikit_learn") + "-*.dist-info")):
            version = os.path.basename(info)[: -len(".dist-info")].split("-")[1]
        parts.append({"name": pkg, "version": version, "path": root, "licence": licence, "files": len(pd), "bytes": pb})
        docs += pd
        n_bytes += pb
    return parts, docs, n_bytes


def as_chat(rel, text):
    """A training document in the Qwen3.5 chat format (what `hyspec run --chat` renders), with an
    empty reasoning block, so the demo answers a request for a module with code."""
    label, _, path = rel.partition(os.sep)
    module = path[:-3].replace(os.sep, ".")
    if label != "stdlib":
        module = label + "." + module
    if module.endswith(".__init__"):
        module = module[: -len(".__init__")]
    return ("<|im_start|>user\nWrite the Python module `" + module + "`.<|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n```python\n" + text.rstrip("\n") + "\n```<|im_end|>\n")


# ---------------------------------------------------------------------------------------------
# 2. Tokenizer
# ---------------------------------------------------------------------------------------------

def train_tokenizer(texts):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_PRETOKENIZER), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(SPECIALS), min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens(SPECIALS)  # appended after the learned vocabulary, as Qwen's are
    return tok


# ---------------------------------------------------------------------------------------------
# Shared pieces: RoPE on plain positions, the attention block used by the MTP head
# ---------------------------------------------------------------------------------------------

def rope_cos_sin(pos, n_rot, theta=ROPE_THETA):
    """NeoX RoPE tables for positions `pos` (any shape): cos/sin of shape pos.shape + [n_rot]."""
    inv = 1.0 / (theta ** (torch.arange(0, n_rot, 2, device=pos.device, dtype=torch.float32) / n_rot))
    f = pos.float()[..., None] * inv
    f = torch.cat([f, f], dim=-1)
    return f.cos(), f.sin()


def apply_rope(x, cos, sin):
    """x [B, heads, T, D]; cos/sin [B or 1, T, n_rot]: rotate the first n_rot dims (NeoX halves)."""
    n_rot = cos.shape[-1]
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    xr, xp = x[..., :n_rot], x[..., n_rot:]
    x1, x2 = xr[..., : n_rot // 2], xr[..., n_rot // 2:]
    rot = torch.cat([-x2, x1], dim=-1)
    return torch.cat([xr * cos + rot * sin, xp], dim=-1)


def gated_attention_layer(layer, x, pos, mask, n_rot):
    """One Qwen3.5 full-attention decoder layer (HF Qwen3_5DecoderLayer weights) with an explicit
    boolean mask [T, T] (True = attend) and plain positions pos [T]: what hyspec's MTP block does."""
    a = layer.self_attn
    B, T, _ = x.shape
    nh, nkv, hd = a.config.num_attention_heads, a.config.num_key_value_heads, a.head_dim
    h = layer.input_layernorm(x)
    q, gate = a.q_proj(h).view(B, T, nh, 2 * hd).chunk(2, dim=-1)
    gate = gate.reshape(B, T, nh * hd)
    q = a.q_norm(q).transpose(1, 2)
    k = a.k_norm(a.k_proj(h).view(B, T, nkv, hd)).transpose(1, 2)
    v = a.v_proj(h).view(B, T, nkv, hd).transpose(1, 2)
    cos, sin = rope_cos_sin(pos[None], n_rot)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    o = o.transpose(1, 2).reshape(B, T, nh * hd) * torch.sigmoid(gate)
    x = x + a.o_proj(o)
    return x + layer.mlp(layer.post_attention_layernorm(x))


# ---------------------------------------------------------------------------------------------
# 3. Target
# ---------------------------------------------------------------------------------------------

def target_config(vocab, eos_id, pad_id):
    from transformers import Qwen3_5TextConfig
    t = TARGET
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(t["layers"])]
    cfg = Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=t["hidden"], intermediate_size=t["ffn"], num_hidden_layers=t["layers"],
        num_attention_heads=t["heads"], num_key_value_heads=t["kv_heads"], head_dim=t["head_dim"],
        linear_num_key_heads=t["gdn_k_heads"], linear_num_value_heads=t["gdn_v_heads"],
        linear_key_head_dim=t["gdn_head_dim"], linear_value_head_dim=t["gdn_head_dim"],
        linear_conv_kernel_dim=t["conv_kernel"], layer_types=layer_types, full_attention_interval=4,
        max_position_embeddings=t["ctx"], rms_norm_eps=EPS, hidden_act="silu", attention_bias=False,
        partial_rotary_factor=0.25,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA, "partial_rotary_factor": 0.25,
                         "mrope_section": [3, 3, 2], "mrope_interleaved": True},
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id,
        initializer_range=0.02, use_cache=True,
    )
    cfg._attn_implementation = "sdpa"
    return cfg


def sample_windows(ids, batch, length, gen):
    starts = torch.randint(0, ids.numel() - length, (batch,), device=ids.device, generator=gen)
    return ids[starts[:, None] + torch.arange(length, device=ids.device)]


def cosine_lr(step, steps, peak, warmup, floor=0.1):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p)))


class StepBudget:
    """A phase's step count: the requested one, or fewer so the phase fits `seconds` (timed over
    steps 10..40 of the run, inside every phase's warm-up, so the LR schedule stays whole)."""

    def __init__(self, steps, seconds):
        self.steps, self.seconds, self.t0, self.t10 = steps, seconds, time.time(), None

    def after(self, step):
        if not self.seconds or step + 1 not in (10, 40) or self.steps <= 40:
            return
        if DEV == "cuda":
            torch.cuda.synchronize()
        if step + 1 == 10:
            self.t10 = time.time()
            return
        per = (time.time() - self.t10) / 30
        left = self.seconds - (time.time() - self.t0)
        self.steps = max(41, min(self.steps, 40 + int(left / per)))


def make_adamw(params, lr, wd):
    decay = [p for p in params if p.ndim >= 2]
    other = [p for p in params if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": other, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=DEV == "cuda")


@torch.no_grad()
def eval_loss(model, val_ids, batch, length, gen, n_batches=4):
    model.eval()
    total = 0.0
    for _ in range(n_batches):
        x = sample_windows(val_ids, batch, length + 1, gen)
        with amp():
            logits = model(input_ids=x[:, :-1], use_cache=False).logits
        total += F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten()).item()
    model.train()
    return total / n_batches


def train_target(cfg, train_ids, val_ids, args, gen, stats):
    from transformers import Qwen3_5ForCausalLM
    model = Qwen3_5ForCausalLM(cfg).to(DEV)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"target: {n_params / 1e6:.2f} M parameters (tied embeddings)")
    opt = make_adamw(list(model.parameters()), args.target_lr, 0.1)
    B, L = args.batch, args.seq
    budget = StepBudget(args.target_steps, args.target_seconds)
    curve, val_curve = [], []
    acc = torch.zeros((), device=DEV)
    t_start = time.time()
    step = -1
    while step + 1 < budget.steps:
        step += 1
        steps = budget.steps
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, steps, args.target_lr, min(150, args.target_steps // 10 + 1))
        x = sample_windows(train_ids, B, L + 1, gen)
        with amp():
            logits = model(input_ids=x[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        budget.after(step)
        steps = budget.steps
        acc += loss.detach()
        if (step + 1) % 10 == 0 or step == steps - 1:
            n = 10 if (step + 1) % 10 == 0 else (step + 1) % 10
            curve.append([step + 1, acc.item() / n])
            acc.zero_()
        if (step + 1) % args.eval_every == 0 or step == steps - 1:
            v = eval_loss(model, val_ids, 16, L, gen)
            val_curve.append([step + 1, v])
            rate = (step + 1) * B * L / (time.time() - t_start)
            log(f"target step {step + 1}/{steps}: train {curve[-1][1]:.3f}, held-out {v:.3f} "
                f"(ppl {math.exp(v):.2f}), {rate / 1e3:.0f}k tok/s")
    stats["target"] = {"params": n_params, "steps": steps, "batch": B, "seq": L, "lr": args.target_lr,
                       "train_loss": curve, "heldout_loss": val_curve, "seconds": time.time() - t_start,
                       "tokens_seen": steps * B * L}
    return model


def round_to_bf16_(module):
    """The shipped checkpoint stores matrices as bf16: make the in-memory model match it exactly."""
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim >= 2:
                p.copy_(p.to(torch.bfloat16).float())


@torch.no_grad()
def target_pass(model, x, taps=()):
    """Teacher-forced target forward over x [B, T]: final-norm hidden [B, T, E] (bf16 autocast),
    logits [B, T, V], and the outputs of the layers in `taps` concatenated [B, T, len(taps)*E]."""
    captured = {}
    hooks = []
    for i in taps:
        def hook(_m, _inp, out, i=i):
            captured[i] = out[0] if isinstance(out, tuple) else out
        hooks.append(model.model.layers[i].register_forward_hook(hook))
    try:
        with amp():
            hs = model.model(input_ids=x, use_cache=False).last_hidden_state
            logits = model.lm_head(hs)
    finally:
        for h in hooks:
            h.remove()
    feats = torch.cat([captured[i] for i in taps], dim=-1) if taps else None
    return hs, logits, feats


@torch.no_grad()
def generate_greedy(model, prompts, n_new):
    """Greedy continuations with the HF cache (GDN recurrent state + KV): [B, P + n_new]."""
    model.eval()
    B, P = prompts.shape
    with amp():
        out = model(input_ids=prompts, use_cache=True)
        cache = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1)
        toks = [nxt]
        for i in range(n_new - 1):
            pos = torch.full((B, 1), P + i, device=prompts.device, dtype=torch.long)
            out = model(input_ids=nxt[:, None], position_ids=pos, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            nxt = out.logits[:, -1].argmax(-1)
            toks.append(nxt)
    return torch.cat([prompts, torch.stack(toks, dim=1)], dim=1)


# ---------------------------------------------------------------------------------------------
# 4. MTP head
# ---------------------------------------------------------------------------------------------

class Mtp(nn.Module):
    """Qwen3.5's nextn block with the names real checkpoints use under `mtp.`."""

    def __init__(self, cfg, attn_layer):
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm
        E = cfg.hidden_size
        self.fc = nn.Linear(2 * E, E, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(E, eps=cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(E, eps=cfg.rms_norm_eps)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(cfg, attn_layer)])
        self.norm = Qwen3_5RMSNorm(E, eps=cfg.rms_norm_eps)
        nn.init.normal_(self.fc.weight, std=0.02)
        self.n_rot = int(cfg.head_dim * 0.25)

    def rows(self, hidden, tok_emb):
        """Input rows x = fc([enorm(embed(t_{p+1})); hnorm(h_p)]) (embedding first)."""
        return self.fc(torch.cat([self.pre_fc_norm_embedding(tok_emb), self.pre_fc_norm_hidden(hidden)], dim=-1))

    def block(self, x, pos, mask):
        return self.norm(gated_attention_layer(self.layers[0], x, pos, mask, self.n_rot))


def chain_layout(L, steps, device):
    """Rows of `steps` chained MTP passes over L anchors, laid out [step 0 rows; step 1 rows; ...]:
    row (s, t) sits at position t + s and sees step-0 rows 0..t plus the rows (1..s, t) of its own
    chain, as the MTP KV cache does in hyspec when drafts are chained after the committed rows."""
    idx = torch.arange(steps * L, device=device)
    s, t = idx // L, idx % L
    mask = ((s[None] == 0) & (t[None] <= t[:, None])) | ((s[None] > 0) & (s[None] <= s[:, None]) & (t[None] == t[:, None]))
    return t + s, mask


def mtp_chain(mtp, model, hs, x_next, steps, feed=None):
    """Chained MTP over all anchors t = 0..L-1 of a batch: step 0 takes (h_t, x_{t+1}); step s>0
    takes the previous step's normed output and token feed[s][:, t] (or its own argmax).
    Returns per-step normed outputs [steps][B, L, E] and logits [steps][B, L, V]."""
    B, L, E = hs.shape
    W = model.lm_head.weight
    embed = model.model.embed_tokens
    rows = [mtp.rows(hs, embed(x_next))]
    outs, logits = [], []
    for s in range(steps):
        pos, mask = chain_layout(L, s + 1, hs.device)
        y = mtp.block(torch.cat(rows, dim=1), pos, mask)[:, s * L:]
        lg = F.linear(y, W)
        outs.append(y)
        logits.append(lg)
        if s + 1 < steps:
            tok = feed[s + 1] if feed is not None else lg.argmax(-1)
            rows.append(mtp.rows(y.detach(), embed(tok)))
    return outs, logits


def soft_ce(logits, teacher_logits):
    p = F.softmax(teacher_logits.float(), dim=-1)
    return -(p * F.log_softmax(logits.float(), dim=-1)).sum(-1).mean()


def train_mtp(model, cfg, train_ids, gen_data, args, gen, stats):
    attn_layer = max(i for i, t in enumerate(cfg.layer_types) if t == "full_attention")
    mtp = Mtp(cfg, attn_layer).to(DEV)
    mtp.layers[0].load_state_dict(model.model.layers[attn_layer].state_dict())  # warm start
    opt = make_adamw(list(mtp.parameters()), args.mtp_lr, 0.01)
    B, L = args.mtp_batch, args.mtp_seq
    budget = StepBudget(args.mtp_steps, args.mtp_seconds)
    curve = []
    t_start = time.time()
    step = -1
    while step + 1 < budget.steps:
        step += 1
        steps = budget.steps
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, steps, args.mtp_lr, min(30, args.mtp_steps // 10 + 1))
        # Half corpus windows, half the target's own greedy text (what decoding will look like).
        x = sample_windows(train_ids, B // 2, L + 2, gen)
        if gen_data is not None:
            j = torch.randint(0, gen_data.shape[0], (B - B // 2,), device=DEV, generator=gen)
            x = torch.cat([x, gen_data[j, : L + 2]], dim=0)
        hs, tlogits, _ = target_pass(model, x)
        with amp():
            # step 0 row t: (h_t, x_{t+1}) -> the target's distribution at t+1; step 1: (own out, x_{t+2}) -> at t+2
            _, lg = mtp_chain(mtp, model, hs[:, :L], x[:, 1:L + 1], 2, feed=[None, x[:, 2:L + 2]])
        l1 = soft_ce(lg[0], tlogits[:, 1:L + 1])
        l2 = soft_ce(lg[1], tlogits[:, 2:L + 2])
        loss = l1 + 0.5 * l2
        loss.backward()
        torch.nn.utils.clip_grad_norm_(mtp.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        budget.after(step)
        steps = budget.steps
        report = (step + 1) % max(1, steps // 5) == 0 or step == steps - 1
        if (step + 1) % 10 == 0 or report:
            with torch.no_grad():
                a1 = (lg[0].argmax(-1) == tlogits[:, 1:L + 1].argmax(-1)).float().mean().item()
                a2 = (lg[1].argmax(-1) == tlogits[:, 2:L + 2].argmax(-1)).float().mean().item()
            curve.append([step + 1, l1.item(), l2.item(), a1, a2])
        if report:
            c = curve[-1]
            log(f"mtp step {step + 1}/{steps}: soft-CE {c[1]:.3f} / chained {c[2]:.3f}, "
                f"top-1 agreement with the target {c[3]:.3f} / {c[4]:.3f}")
    stats["mtp"] = {"steps": steps, "batch": B, "seq": L, "lr": args.mtp_lr, "curve": curve,
                    "curve_columns": ["step", "soft_ce", "soft_ce_chained", "top1_agree", "top1_agree_chained"],
                    "seconds": time.time() - t_start}
    return mtp


# ---------------------------------------------------------------------------------------------
# 5. DFlash drafter (z-lab layout; the math of hyspec's model/dflash_forward.cpp)
# ---------------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """Qwen3's RMSNorm (plain weight, not the 1+w of Qwen3.5)."""

    def __init__(self, n, eps=EPS):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


class DraftAttention(nn.Module):
    def __init__(self, E, nh, nkv, hd):
        super().__init__()
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(E, nh * hd, bias=False)
        self.k_proj = nn.Linear(E, nkv * hd, bias=False)
        self.v_proj = nn.Linear(E, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, E, bias=False)
        self.q_norm = RMSNorm(hd)
        self.k_norm = RMSNorm(hd)


class DraftMlp(nn.Module):
    def __init__(self, E, F_):
        super().__init__()
        self.gate_proj = nn.Linear(E, F_, bias=False)
        self.up_proj = nn.Linear(E, F_, bias=False)
        self.down_proj = nn.Linear(F_, E, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, E, nh, nkv, hd, F_):
        super().__init__()
        self.input_layernorm = RMSNorm(E)
        self.self_attn = DraftAttention(E, nh, nkv, hd)
        self.post_attention_layernorm = RMSNorm(E)
        self.mlp = DraftMlp(E, F_)


class Drafter(nn.Module):
    def __init__(self, E, n_taps, layers, nh, nkv, hd, F_):
        super().__init__()
        self.fc = nn.Linear(n_taps * E, E, bias=False)
        self.hidden_norm = RMSNorm(E)
        self.layers = nn.ModuleList([DraftLayer(E, nh, nkv, hd, F_) for _ in range(layers)])
        self.norm = RMSNorm(E)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, feats, ctx_pos, x, blk_pos, mask):
        """feats [B, L, taps*E] of the context positions ctx_pos [B, L]; x [B, Q, E] block embeddings at
        blk_pos [B, Q]; mask [B, 1, Q, L+Q] (True = attend) over [context ; block] keys.
        Context K = RoPE(k_norm(W_k g)), V = W_v g with g = hidden_norm(fc(f)); the block attends
        non-causally. Returns the final-normed block hidden [B, Q, E]."""
        if not torch.is_autocast_enabled():
            feats = feats.to(self.fc.weight.dtype)  # stored bf16
        g = self.hidden_norm(self.fc(feats))
        B, L, _ = g.shape
        Q = x.shape[1]
        a0 = self.layers[0].self_attn
        hd = a0.hd
        cos_c, sin_c = rope_cos_sin(ctx_pos, hd)
        cos_b, sin_b = rope_cos_sin(blk_pos, hd)
        for layer in self.layers:
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q = a.q_norm(a.q_proj(h).view(B, Q, a.nh, hd)).transpose(1, 2)
            kb = a.k_norm(a.k_proj(h).view(B, Q, a.nkv, hd)).transpose(1, 2)
            vb = a.v_proj(h).view(B, Q, a.nkv, hd).transpose(1, 2)
            kc = a.k_norm(a.k_proj(g).view(B, L, a.nkv, hd)).transpose(1, 2)
            vc = a.v_proj(g).view(B, L, a.nkv, hd).transpose(1, 2)
            q, kb, kc = apply_rope(q, cos_b, sin_b), apply_rope(kb, cos_b, sin_b), apply_rope(kc, cos_c, sin_c)
            k = torch.cat([kc, kb], dim=2).repeat_interleave(a.nh // a.nkv, dim=1)
            v = torch.cat([vc, vb], dim=2).repeat_interleave(a.nh // a.nkv, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + a.o_proj(o.transpose(1, 2).reshape(B, Q, a.nh * hd))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)


def dflash_blocks(anchors, L, block, mask_id, toks):
    """For anchors [B, nb]: block tokens [B, nb*block] ([x_a, mask x (block-1)]), positions, the
    mask [B, 1, Q, L+Q] (context keys < a, keys of the same block) and label positions a+1..a+block-1."""
    B, nb = anchors.shape
    dev = anchors.device
    k = torch.arange(block, device=dev)
    pos = (anchors[:, :, None] + k).reshape(B, nb * block)
    tokens = torch.full((B, nb, block), mask_id, device=dev, dtype=torch.long)
    tokens[:, :, 0] = torch.gather(toks, 1, anchors)
    qb = torch.arange(nb * block, device=dev) // block
    ctx_ok = torch.arange(L, device=dev)[None, None, :] < anchors[:, qb][:, :, None]
    blk_ok = (qb[:, None] == qb[None, :]).expand(B, -1, -1)
    mask = torch.cat([ctx_ok, blk_ok], dim=-1)[:, None]
    return tokens.reshape(B, nb * block), pos, mask


@torch.no_grad()
def dflash_matches(drafter, model, X, Y, feats, anchors, mask_id):
    """Leading drafts equal to the greedy labels for the blocks at `anchors` [n, na] of sequences X
    (labels Y, features feats): [n, na] in 0..block-1."""
    n, L = X.shape
    blk = DRAFT["block"]
    btok, bpos, mask = dflash_blocks(anchors, L, blk, mask_id, X)
    with amp():
        y = drafter(feats, torch.arange(L, device=DEV)[None].expand(n, -1), model.model.embed_tokens(btok), bpos, mask)
        dl = F.linear(y, model.lm_head.weight).view(n, anchors.shape[1], blk, -1)[:, :, 1:].argmax(-1)
    lab = torch.gather(Y, 1, (anchors[:, :, None] + torch.arange(1, blk, device=DEV)).flatten(1))
    return torch.cumprod((dl == lab.view(n, -1, blk - 1)).int(), dim=-1).sum(-1)


def make_drafter(E):
    d = DRAFT
    return Drafter(E, len(d["taps"]), d["layers"], d["heads"], d["kv_heads"], d["head_dim"], d["ffn"]).to(DEV)


def train_dflash(model, data, val, args, gen, stats, mask_id):
    X, Y, P, FEATS = data["tokens"], data["labels"], data["prompt_len"], data["features"]
    # Held-out blocks (greedy continuations of held-out prompts, fixed anchors): the drafter kept is
    # the one that drafts them best, so it cannot end on a memorised training set.
    nv = val["tokens"].shape[0]
    vg = torch.Generator(device=DEV)
    vg.manual_seed(args.seed + 1)
    u = torch.rand((nv, 8), device=DEV, generator=vg)
    v_anchors = (val["prompt_len"][:, None] + u * (val["tokens"].shape[1] - DRAFT["block"] + 1 -
                                                   val["prompt_len"][:, None])).long()

    def validate():
        drafter.eval()
        m = torch.cat([dflash_matches(drafter, model, val["tokens"][i:i + 64], val["labels"][i:i + 64],
                                      val["features"][i:i + 64], v_anchors[i:i + 64], mask_id)
                       for i in range(0, nv, 64)])
        drafter.train()
        return m.float().mean().item() + 1

    N, L = X.shape
    E = model.config.hidden_size
    blk, nb = DRAFT["block"], args.dflash_blocks
    drafter = make_drafter(E)
    n_params = sum(p.numel() for p in drafter.parameters())
    log(f"drafter: {n_params / 1e6:.2f} M parameters")
    opt = make_adamw(list(drafter.parameters()), args.dflash_lr, 0.1)
    W = model.lm_head.weight
    embed = model.model.embed_tokens
    wk = torch.exp(-(torch.arange(1, blk, device=DEV).float() - 1) / 7.0)  # earlier block rows matter more
    ctx_pos = torch.arange(L, device=DEV)[None].expand(args.dflash_batch, -1)
    curve, val_curve = [], []
    best = (0.0, 0, None)
    t_start = time.time()
    budget = StepBudget(args.dflash_steps, args.dflash_seconds)
    step = -1
    while step + 1 < budget.steps:
        step += 1
        steps = budget.steps
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, steps, args.dflash_lr, min(50, args.dflash_steps // 10 + 1))
        j = torch.randint(0, N, (args.dflash_batch,), device=DEV, generator=gen)
        toks, labels, plen, feats = X[j], Y[j], P[j], FEATS[j]
        u = torch.rand((args.dflash_batch, nb), device=DEV, generator=gen)
        anchors = (plen[:, None] + u * (L - blk + 1 - plen[:, None])).long()
        btok, bpos, mask = dflash_blocks(anchors, L, blk, mask_id, toks)
        lab = torch.gather(labels, 1, (anchors[:, :, None] + torch.arange(1, blk, device=DEV)).flatten(1))
        with amp():
            y = drafter(feats, ctx_pos, embed(btok), bpos, mask)
            y = y.view(args.dflash_batch, nb, blk, E)[:, :, 1:]
            logits = F.linear(y, W)
        ce = F.cross_entropy(logits.float().flatten(0, 2), lab.flatten(), reduction="none").view(-1, blk - 1)
        loss = (ce * wk).sum(-1).mean() / wk.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        budget.after(step)
        steps = budget.steps
        report = (step + 1) % max(1, steps // 5) == 0 or step == steps - 1
        if (step + 1) % 10 == 0 or report:
            with torch.no_grad():
                hit = (logits.argmax(-1).flatten(0, 1) == lab.view(-1, blk - 1))
                first = hit[:, 0].float().mean().item()
                streak = torch.cumprod(hit.int(), dim=1).sum(1).float().mean().item() + 1
            curve.append([step + 1, loss.item(), first, streak])
        if (step + 1) % args.dflash_eval_every == 0 or step == steps - 1:
            v = validate()
            val_curve.append([step + 1, v])
            if v > best[0]:
                best = (v, step + 1, {k: t.detach().clone() for k, t in drafter.state_dict().items()})
        if report:
            c = curve[-1]
            log(f"dflash step {step + 1}/{steps}: weighted CE {c[1]:.3f}, first-draft accuracy {c[2]:.3f}, "
                f"block acceptance length {c[3]:.2f} (training anchors)" +
                (f", {val_curve[-1][1]:.2f} (held-out, step {val_curve[-1][0]})" if val_curve else ""))
    drafter.load_state_dict(best[2])
    log(f"dflash: keeping step {best[1]} (held-out block acceptance length {best[0]:.2f})")
    stats["dflash"] = {"params": n_params, "steps": steps, "batch": args.dflash_batch, "blocks_per_seq": nb,
                       "lr": args.dflash_lr, "curve": curve,
                       "curve_columns": ["step", "weighted_ce", "first_draft_acc", "acceptance_length"],
                       "heldout_curve": val_curve, "kept_step": best[1], "seconds": time.time() - t_start}
    return drafter


def build_greedy_data(model, ids, n_seqs, args, gen, prompt_lens=(32, 64, 96, 128)):
    """The target's own greedy continuations of n_seqs windows of `ids` (all of length dflash_seq),
    with the teacher-forced labels y_q = argmax p(. | x_<q) and the tapped features."""
    L = args.dflash_seq
    per = max(1, n_seqs // len(prompt_lens))
    toks, plens = [], []
    for P in prompt_lens:
        for s in range(0, per, args.gen_batch):
            b = min(args.gen_batch, per - s)
            prompts = sample_windows(ids, b, P, gen)
            toks.append(generate_greedy(model, prompts, L - P))
            plens.append(torch.full((b,), P, device=DEV, dtype=torch.long))
    X = torch.cat(toks)
    labels, feats = [], []
    for s in range(0, X.shape[0], 128):
        _, lg, f = target_pass(model, X[s:s + 128], DRAFT["taps"])
        y = torch.empty_like(X[s:s + 128])
        y[:, 1:] = lg[:, :-1].argmax(-1)
        y[:, 0] = X[s:s + 128, 0]
        labels.append(y)
        feats.append(f.to(torch.bfloat16))
    Y = torch.cat(labels)
    gen_region = torch.arange(L, device=DEV)[None] >= torch.cat(plens)[:, None]
    agree = ((X == Y) | ~gen_region).float().mean().item()
    return {"tokens": X, "labels": Y, "prompt_len": torch.cat(plens), "features": torch.cat(feats),
            "greedy_self_agreement": agree}


# ---------------------------------------------------------------------------------------------
# 6. Held-out acceptance (greedy, simulated round by round as hyspec's engine runs it)
# ---------------------------------------------------------------------------------------------

def simulate_rounds(matches, t0, t_max, k):
    """matches[t] = leading drafts (of the round whose pending token is x_{t+1}) equal to the greedy
    tokens. Rounds start at t = t0 (the prompt's last position) and run while t <= t_max; a round
    accepts m = min(k, matches[t]) drafts plus the target's own token."""
    t, rounds, acc = t0, 0, 0
    while t <= t_max:
        m = min(k, int(matches[t]))
        rounds += 1
        acc += m
        t += m + 1
    return rounds, acc


@torch.no_grad()
def heldout_acceptance(model, mtp, drafter, val_ids, args, gen, mask_id):
    P, L, n = 64, args.dflash_seq, args.eval_prompts
    prompts = sample_windows(val_ids, n, P, gen)
    X = generate_greedy(model, prompts, L - P)
    hs, lg, feats = target_pass(model, X, DRAFT["taps"])
    Y = torch.empty_like(X)
    Y[:, 1:] = lg[:, :-1].argmax(-1)
    Y[:, 0] = X[:, 0]
    out = {"prompts": n, "prompt_len": P, "seq_len": L,
           "greedy_self_agreement": (X[:, P:] == Y[:, P:]).float().mean().item()}

    # MTP: drafts d_j after committed row t (pending x_{t+1}) predict x_{t+1+j}.
    K = 4
    with amp():
        _, mlg = mtp_chain(mtp, model, hs[:, : L - 1], X[:, 1:], K)
    d = torch.stack([g.argmax(-1) for g in mlg], dim=-1)  # [n, L-1, K]
    tgt = torch.full_like(d, -1)
    for j in range(K):
        tgt[:, : L - 2 - j, j] = Y[:, 2 + j:]
    mm = torch.cumprod((d == tgt).int(), dim=-1).sum(-1).cpu()
    out["mtp"] = {}
    for k in (1, 2, 3, 4):
        R = A = 0
        for b in range(n):
            r, a = simulate_rounds(mm[b], P - 1, L - 2 - k, k)
            R, A = R + r, A + a
        out["mtp"][f"draft_max_{k}"] = {"rounds": R, "accepted": A, "mean_acceptance_length": (A + R) / max(1, R)}

    # DFlash: the block at anchor a = t+1 (pending token x_a, context 0..a-1) drafts x_{a+1..a+15}.
    blk = DRAFT["block"]
    anchors_all = torch.arange(P, L - blk + 1, device=DEV)
    mt = torch.zeros(n, L, dtype=torch.long)
    for s in range(0, anchors_all.numel(), 32):
        anchors = anchors_all[s:s + 32][None].expand(n, -1).contiguous()
        mt[:, anchors[0].cpu() - 1] = dflash_matches(drafter, model, X, Y, feats, anchors, mask_id).cpu()  # by t = a-1
    R = A = 0
    for b in range(n):
        r, a = simulate_rounds(mt[b], P - 1, L - blk - 1, blk - 1)
        R, A = R + r, A + a
    out["dflash"] = {"block_size": blk, "rounds": R, "accepted": A, "mean_acceptance_length": (A + R) / max(1, R),
                     "all_anchor_mean": mt[:, P - 1:L - blk].float().mean().item() + 1}
    return out, X


# ---------------------------------------------------------------------------------------------
# Dry-run checks
# ---------------------------------------------------------------------------------------------

def read_gguf_f32(path, names):
    """Minimal GGUF reader: the named F32 tensors as torch tensors [ne1, ne0]."""
    data = open(path, "rb").read()
    off = 0

    def rd(fmt):
        nonlocal off
        v = struct.unpack_from("<" + fmt, data, off)
        off += struct.calcsize("<" + fmt)
        return v[0]

    def rstr():
        nonlocal off
        n = rd("Q")
        s = data[off:off + n].decode()
        off += n
        return s

    sizes = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def skip(t):
        if t == 8:
            rstr()
        elif t == 9:
            et, n = rd("I"), rd("Q")
            for _ in range(n):
                skip(et)
        else:
            rd(sizes[t])

    assert data[:4] == b"GGUF"
    off = 8
    n_t, n_kv = rd("Q"), rd("Q")
    align = 32
    for _ in range(n_kv):
        k, t = rstr(), rd("I")
        if k == "general.alignment":
            align = rd("I")
        else:
            skip(t)
    infos = {}
    for _ in range(n_t):
        name = rstr()
        nd = rd("I")
        ne = [rd("Q") for _ in range(nd)]
        typ, o = rd("I"), rd("Q")
        infos[name] = (ne, typ, o)
    base = (off + align - 1) // align * align
    out = {}
    for n in names:
        ne, typ, o = infos[n]
        assert typ == 0, n
        cnt = ne[0] * (ne[1] if len(ne) > 1 else 1)
        arr = torch.frombuffer(bytearray(data[base + o: base + o + 4 * cnt]), dtype=torch.float32)
        out[n] = arr.view(ne[1], ne[0]) if len(ne) > 1 else arr
    return out


def check_drafter_forward(fx_dir):
    """My drafter forward against llama.cpp's draft logits of the dflash-tiny fixture."""
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(fx_dir, "hf", "config.json")))
    man = json.load(open(os.path.join(fx_dir, "manifest.json")))
    sd = load_file(os.path.join(fx_dir, "hf", "model.safetensors"))
    dc = cfg["dflash_config"]
    E = cfg["hidden_size"]
    d = Drafter(E, len(dc["target_layer_ids"]), cfg["num_hidden_layers"], cfg["num_attention_heads"],
                cfg["num_key_value_heads"], cfg["head_dim"], cfg["intermediate_size"]).double()
    d.load_state_dict({k: v.double() for k, v in sd.items()})
    t = read_gguf_f32(os.path.join(fx_dir, "qwen35-tiny-f32.gguf"), ["token_embd.weight", "output.weight"])
    worst = 0.0
    for case in man["cases"]:
        n = len(case["tokens"])
        f = torch.frombuffer(bytearray(open(os.path.join(fx_dir, case["features"]), "rb").read()),
                             dtype=torch.float32).view(1, n, -1).double()
        ref = torch.frombuffer(bytearray(open(os.path.join(fx_dir, case["draft_logits"]), "rb").read()),
                               dtype=torch.float32).view(16, -1).double()
        anchors = torch.tensor([[n]])
        toks = torch.tensor([[0] * n + [case["last_token"]]])
        btok, bpos, mask = dflash_blocks(anchors, n, 16, dc["mask_token_id"], toks)
        x = t["token_embd.weight"].double()[btok]
        y = d(f, torch.arange(n)[None], x, bpos, mask)
        lg = F.linear(y, t["output.weight"].double())[0]
        err = (lg[1:] - ref[1:]).abs().max().item()
        same = (lg[1:].argmax(-1) == ref[1:].argmax(-1)).float().mean().item()
        log(f"check drafter vs llama.cpp ({case['name']}): max |diff| {err:.2e}, argmax agreement {same:.2f}")
        worst = max(worst, err)
    return worst


def check_mtp_layer(model, cfg):
    """gated_attention_layer (explicit mask, my RoPE) against transformers' own decoder layer."""
    idx = max(i for i, t in enumerate(cfg.layer_types) if t == "full_attention")
    layer = model.model.layers[idx]
    x = torch.randn(2, 37, cfg.hidden_size, device=DEV)
    pos = torch.arange(37, device=DEV)
    mask = torch.ones(37, 37, dtype=torch.bool, device=DEV).tril()
    with torch.no_grad():
        mine = gated_attention_layer(layer, x, pos, mask, int(cfg.head_dim * 0.25))
        pe = model.model.rotary_emb(x, pos[None, None].expand(3, 2, -1))
        ref = layer(x, position_embeddings=pe, attention_mask=None)
        ref = ref[0] if isinstance(ref, tuple) else ref
    err = (mine - ref).abs().max().item()
    log(f"check MTP attention layer vs transformers' Qwen3_5DecoderLayer: max |diff| {err:.2e}")
    return err


# ---------------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------------

def save_sharded(tensors, out_dir, max_bytes):
    from safetensors.torch import save_file
    names = sorted(tensors)
    shards, cur, size = [], {}, 0
    for n in names:
        b = tensors[n].numel() * tensors[n].element_size()
        if cur and size + b > max_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[n] = tensors[n]
        size += b
    shards.append(cur)
    weight_map = {}
    for i, sh in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sh, os.path.join(out_dir, fn), metadata={"format": "pt"})
        weight_map.update({n: fn for n in sh})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return len(shards)


def checkpoint_tensors(state, prefix=""):
    """Matrices in bf16, 1-D tensors (norms, A_log, dt_bias) in f32."""
    out = {}
    for k, v in state.items():
        v = v.detach().cpu().contiguous()
        out[prefix + k] = v.to(torch.bfloat16) if v.ndim >= 2 else v.float()
    return out


def plot(stats, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    t = stats["target"]
    ax[0].plot(*zip(*t["train_loss"]), label="train")
    ax[0].plot(*zip(*t["heldout_loss"]), "o-", label="held-out")
    ax[0].set(title="target: next-token CE", xlabel="step", ylabel="nats")
    m = stats["mtp"]["curve"]
    ax[1].plot([c[0] for c in m], [c[1] for c in m], label="soft CE, draft 1")
    ax[1].plot([c[0] for c in m], [c[2] for c in m], label="soft CE, draft 2 (chained)")
    ax1b = ax[1].twinx()
    ax1b.plot([c[0] for c in m], [c[3] for c in m], "g--", label="top-1 agreement, draft 1")
    ax1b.set_ylim(0, 1)
    ax[1].set(title="MTP head (frozen target)", xlabel="step", ylabel="nats")
    d = stats["dflash"]["curve"]
    ax[2].plot([c[0] for c in d], [c[1] for c in d], label="weighted CE")
    ax2b = ax[2].twinx()
    ax2b.plot([c[0] for c in d], [c[3] for c in d], "r--", label="acceptance length (train anchors)")
    if stats["dflash"].get("heldout_curve"):
        ax2b.plot(*zip(*stats["dflash"]["heldout_curve"]), "m.-", label="acceptance length (held-out)")
    ax[2].set(title="DFlash drafter (block 16)", xlabel="step", ylabel="nats")
    for a in (ax[0], ax[1], ax[2], ax1b, ax2b):
        a.legend(loc="upper right" if a in (ax[0], ax[1], ax[2]) else "center right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--dry-run", action="store_true", help="a few steps of everything, plus the checks")
    ap.add_argument("--fixtures", help="dflash-tiny fixture dir (+ qwen35-tiny-f32.gguf) for the drafter check")
    ap.add_argument("--chat-template", help="Jinja chat template stored in tokenizer_config.json")
    ap.add_argument("--target-steps", type=int, default=1200)
    ap.add_argument("--target-seconds", type=float, default=250)
    ap.add_argument("--target-lr", type=float, default=2e-3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--mtp-steps", type=int, default=400)
    ap.add_argument("--mtp-seconds", type=float, default=35)
    ap.add_argument("--mtp-lr", type=float, default=1e-3)
    ap.add_argument("--mtp-batch", type=int, default=64)
    ap.add_argument("--mtp-seq", type=int, default=254)
    ap.add_argument("--gen-seqs", type=int, default=12288)
    ap.add_argument("--gen-val-seqs", type=int, default=256)
    ap.add_argument("--gen-batch", type=int, default=3072)
    ap.add_argument("--dflash-seq", type=int, default=256)
    ap.add_argument("--dflash-steps", type=int, default=4500)
    ap.add_argument("--dflash-seconds", type=float, default=100)
    ap.add_argument("--dflash-eval-every", type=int, default=250)
    ap.add_argument("--dflash-lr", type=float, default=2e-3)
    ap.add_argument("--dflash-batch", type=int, default=64)
    ap.add_argument("--dflash-blocks", type=int, default=12)
    ap.add_argument("--eval-prompts", type=int, default=64)
    ap.add_argument("--deadline", type=float, default=480,
                    help="seconds after the start by which the drafter training must end (the device allows 600)")
    args = ap.parse_args()
    if args.dry_run:
        args.target_steps, args.eval_every, args.mtp_steps, args.dflash_steps = 30, 15, 10, 20
        args.target_seconds = args.mtp_seconds = args.dflash_seconds = 0
        args.gen_seqs, args.gen_val_seqs, args.gen_batch, args.eval_prompts = 256, 64, 128, 16
        args.dflash_eval_every = 10

    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    gen = torch.Generator(device=DEV)
    gen.manual_seed(args.seed)
    import tokenizers
    import transformers
    stats = {"seed": args.seed, "argv": sys.argv[1:], "python": sys.version.split()[0], "torch": torch.__version__,
             "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
             "device": torch.cuda.get_device_name(0) if DEV == "cuda" else DEV}
    log(f"python {stats['python']}, torch {stats['torch']}, transformers {stats['transformers']}, "
        f"tokenizers {stats['tokenizers']}, {stats['device']}")
    if args.fixtures:
        stats["check_drafter_vs_llamacpp"] = check_drafter_forward(args.fixtures)

    parts, docs, n_bytes = load_corpus()
    train_docs = [(r, t) for r, t, h in docs if not h]
    held_docs = [(r, t) for r, t, h in docs if h]
    log(f"corpus: {len(docs)} files, {n_bytes / 1e6:.1f} MB; {len(held_docs)} held out; " +
        ", ".join(f"{p['name']} {p['files']} files {p['bytes'] / 1e6:.1f} MB" for p in parts))
    stats["corpus"] = {"parts": parts, "files": len(docs), "bytes": n_bytes, "heldout_files": len(held_docs),
                       "heldout": [r for r, _ in held_docs]}

    tok = train_tokenizer(t for _, t in train_docs)
    vocab = tok.get_vocab_size()
    assert vocab <= VOCAB, vocab
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    log(f"tokenizer: {vocab} tokens, specials {ids}")

    eot = ids["<|endoftext|>"]
    rng = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(len(train_docs), generator=rng).tolist()
    texts = []
    for i in order:
        rel, text = train_docs[i]
        chat = int(hashlib.sha1(("chat" + rel).encode()).hexdigest(), 16) % 4 == 0
        texts.append(as_chat(rel, text) if chat else text)

    def stream(txts):
        enc = tok.encode_batch(txts, add_special_tokens=False)
        out = []
        for e in enc:
            out.extend(e.ids)
            out.append(eot)
        return torch.tensor(out, dtype=torch.long, device=DEV)

    train_ids = stream(texts)
    val_ids = stream([t for _, t in held_docs])
    log(f"tokens: train {train_ids.numel() / 1e6:.2f} M, held-out {val_ids.numel() / 1e6:.3f} M "
        f"({n_bytes / (train_ids.numel() + val_ids.numel()):.2f} bytes/token incl. chat wrappers)")
    stats["tokens"] = {"train": train_ids.numel(), "heldout": val_ids.numel(), "vocab": vocab, "specials": ids}

    cfg = target_config(VOCAB, ids["<|im_end|>"], eot)
    model = train_target(cfg, train_ids, val_ids, args, gen, stats)
    round_to_bf16_(model)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    stats["target"]["heldout_loss_bf16"] = eval_loss(model, val_ids, 16, args.seq, gen, n_batches=8)
    log(f"target held-out loss with bf16 weights: {stats['target']['heldout_loss_bf16']:.3f}")
    if args.dry_run:
        stats["check_mtp_layer"] = check_mtp_layer(model, cfg)

    t0 = time.time()
    data = build_greedy_data(model, train_ids, args.gen_seqs, args, gen)
    val_data = build_greedy_data(model, val_ids, args.gen_val_seqs, args, gen, prompt_lens=(64,))
    log(f"greedy data: {data['tokens'].shape[0]} x {data['tokens'].shape[1]} tokens in {time.time() - t0:.1f}s "
        f"(generated == teacher-forced argmax on {data['greedy_self_agreement']:.4f} of positions)")
    stats["greedy_data"] = {"sequences": data["tokens"].shape[0], "seq_len": data["tokens"].shape[1],
                            "seconds": time.time() - t0, "self_agreement": data["greedy_self_agreement"]}

    # Keep the whole run inside the device's limit whatever the phases before took.
    left = args.deadline - (time.time() - T0)
    if args.mtp_seconds:
        args.mtp_seconds = max(10.0, min(args.mtp_seconds, 0.3 * left))
    mtp = train_mtp(model, cfg, train_ids, data["tokens"], args, gen, stats)
    round_to_bf16_(mtp)
    if args.dflash_seconds:
        args.dflash_seconds = max(15.0, min(args.dflash_seconds, args.deadline - (time.time() - T0)))
    drafter = train_dflash(model, data, val_data, args, gen, stats, ids["<|mask|>"])
    round_to_bf16_(drafter)
    del data, val_data
    if DEV == "cuda":
        torch.cuda.empty_cache()

    mtp.eval()
    drafter.eval()
    acc, sample = heldout_acceptance(model, mtp, drafter, val_ids, args, gen, ids["<|mask|>"])
    stats["heldout_acceptance"] = acc
    log("held-out greedy acceptance: MTP " + ", ".join(
        f"k={k[-1]} {v['mean_acceptance_length']:.2f}" for k, v in acc["mtp"].items()) +
        f"; DFlash block 16 {acc['dflash']['mean_acceptance_length']:.2f} "
        f"(all anchors {acc['dflash']['all_anchor_mean']:.2f})")
    stats["sample"] = {"prompt": tok.decode(sample[0, :64].tolist(), skip_special_tokens=False),
                       "continuation": tok.decode(sample[0, 64:].tolist(), skip_special_tokens=False)}
    # The held-out prompts (64 tokens each) and the target's greedy continuations, to measure the
    # same thing with hyspec on the CPU.
    stats["heldout_prompts"] = [{"prompt_ids": sample[i, :64].tolist(), "greedy_ids": sample[i, 64:].tolist(),
                                 "prompt": tok.decode(sample[i, :64].tolist(), skip_special_tokens=False)}
                                for i in range(sample.shape[0])]

    # ---- outputs ----
    out = args.out
    tdir, ddir = os.path.join(out, "target"), os.path.join(out, "drafter")
    os.makedirs(tdir, exist_ok=True)
    os.makedirs(ddir, exist_ok=True)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    tensors = checkpoint_tensors(state)
    tensors.update(checkpoint_tensors(mtp.state_dict(), "mtp."))
    n_shards = save_sharded(tensors, tdir, 15_000_000)
    config = cfg.to_dict()
    config.update({"architectures": ["Qwen3_5ForCausalLM"], "mtp_num_hidden_layers": 1, "dtype": "bfloat16",
                   "partial_rotary_factor": 0.25})
    config["rope_parameters"] = dict(config.get("rope_parameters") or {}, rope_type="default", rope_theta=ROPE_THETA,
                                     partial_rotary_factor=0.25, mrope_section=[3, 3, 2], mrope_interleaved=True)
    for k in [k for k in config if k.startswith("_")]:
        config.pop(k)
    with open(os.path.join(tdir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tok.save(os.path.join(tdir, "tokenizer.json"))
    tcfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>", "model_max_length": TARGET["ctx"]}
    if args.chat_template:
        tcfg["chat_template"] = open(args.chat_template).read()
    with open(os.path.join(tdir, "tokenizer_config.json"), "w") as f:
        json.dump(tcfg, f, indent=2)

    from safetensors.torch import save_file
    save_file(checkpoint_tensors(drafter.state_dict()), os.path.join(ddir, "model.safetensors"),
              metadata={"format": "pt"})
    d = DRAFT
    dcfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": TARGET["hidden"],
            "num_hidden_layers": d["layers"], "num_attention_heads": d["heads"], "num_key_value_heads": d["kv_heads"],
            "head_dim": d["head_dim"], "intermediate_size": d["ffn"], "hidden_act": "silu", "rms_norm_eps": EPS,
            "rope_theta": ROPE_THETA, "max_position_embeddings": TARGET["ctx"], "vocab_size": VOCAB,
            "tie_word_embeddings": False, "attention_bias": False, "torch_dtype": "bfloat16",
            "block_size": d["block"],
            "dflash_config": {"block_size": d["block"], "mask_token_id": ids["<|mask|>"],
                              "target_layer_ids": d["taps"]}}
    with open(os.path.join(ddir, "config.json"), "w") as f:
        json.dump(dcfg, f, indent=2)

    stats["outputs"] = {"target_shards": n_shards, "target_tensors": len(tensors)}
    stats["total_seconds"] = time.time() - T0
    stats["log"] = LOG
    with open(os.path.join(out, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    plot(stats, os.path.join(out, "losses.png"))
    with tarfile.open(os.path.join(out, "meta.tar"), "w") as tar:
        for rel in ("target/config.json", "target/tokenizer.json", "target/tokenizer_config.json",
                    "target/model.safetensors.index.json", "drafter/config.json", "stats.json"):
            tar.add(os.path.join(out, rel), arcname=rel)
    for rel in ("target/config.json", "target/tokenizer.json", "target/tokenizer_config.json",
                "target/model.safetensors.index.json", "drafter/config.json"):
        os.remove(os.path.join(out, rel))
    log(f"done: {n_shards} target shards; files under {out}: " +
        ", ".join(sorted(os.path.relpath(os.path.join(dp, fn), out) for dp, _, fs in os.walk(out) for fn in fs)))


if __name__ == "__main__":
    main()
