import math

import torch

from muon_corpus import KELLER, LR, MOMENTUM, WD, Entry, _momentum

# ------------------------------------------------ 15. deepmodeling/deepmd-kit (HybridMuon)
#
# Read at deepmodeling/deepmd-kit@bc902daf747d93c5d7314338d287fd2dd0a7e32c,
# file deepmd/pt/optimizer/hybrid_muon.py:
#   173-222    constants: 8 Keller steps then 2 Newton steps, the norm floor, Polar Express
#              triples damped by 1.05, the Magma-lite numbers
#   432-482    the batched two-stage NS (what square buckets get by default)
#   485-620    the compiled Gram NS class (what rectangular buckets get by default)
#   623-650    viewing one update as a stack of blocks
#   653-690    Nesterov momentum (the foreach branch: foreach is on by default)
#   742-802    dropping size-1 dims and the "slice" block view
#   1013-1214  Magma-lite scales for a merged bucket, and the one-entry variant
#   1355-1498  rectangular buckets merged by their short side, zero-padded on the long one
#   1500-1566  the per-parameter routing table, made on the first step only
#   1596-1609  foreach weight decay
#   1766-1938  the Muon part of step()
# Defaults followed: lr_adjust=0 (gain 0.18 * sqrt of the long side), Gram on, Magma-lite on,
# "slice" view, foreach on. With Gram on the Triton path can never be chosen: the test that
# chooses it is kept, the kernel is not.

FAST_N, TAIL_N = 8, 2
FAST_ABC = KELLER
NEWTON_ABC = (2.0, -1.5, 0.5)
NORM_FLOOR = 1e-7
_PE_RAW = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
)
PE_SAFETY = 1.05
PE_DAMPED = tuple(
    (a / PE_SAFETY, b / PE_SAFETY**3, c / PE_SAFETY**5)
    for a, b, c in _PE_RAW
)
TRITON_MIN = 1024
ALIGN_TEMP, ALIGN_EMA, ALIGN_FLOOR, ALIGN_EPS = 2.0, 0.9, 0.1, 1e-12
SIG_LO = 1.0 / (1.0 + math.exp(1.0 / ALIGN_TEMP))
SIG_HI = 1.0 / (1.0 + math.exp(-1.0 / ALIGN_TEMP))
GAIN_MODE, GAIN_COEFF = 0.0, 0.18


def _deepmd_two_stage_ns(g, dtype=torch.bfloat16):
    """NS on a (k, m, n) stack in two stages: cast (bf16 by default), turned wide with
    ``transpose``, divided by its norm floored by ``clamp``, 8 Keller iterations, then 2 with
    Newton's (2, -1.5, 0.5); every iteration one ``bmm`` and two ``baddbmm``."""
    if g.ndim != 3:
        raise ValueError("a (B, m, n) stack is required")
    x = g.to(dtype=dtype)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.transpose(-2, -1)
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=NORM_FLOOR)
    fa, fb, fc = FAST_ABC
    for _ in range(FAST_N):
        xx = torch.bmm(x, x.transpose(-2, -1))
        bmat = torch.baddbmm(xx, xx, xx, beta=fb, alpha=fc)
        x = torch.baddbmm(x, bmat, x, beta=fa, alpha=1.0)
    na, nb, nc = NEWTON_ABC
    for _ in range(TAIL_N):
        xx = torch.bmm(x, x.transpose(-2, -1))
        bmat = torch.baddbmm(xx, xx, xx, beta=nb, alpha=nc)
        x = torch.baddbmm(x, bmat, x, beta=na, alpha=1.0)
    if tall:
        x = x.transpose(-2, -1)
    return x


class _DeepmdGramCall:
    """The rectangular path: one function compiled once (fullgraph, dynamic). fp32 cast, wide by
    ``mT``, divided by norm + eps, fp16, then Gram iterations over the five damped Polar Express
    triples with one restart (at index 2); cast back and given its input shape again."""

    def __init__(self, norm_dtype=torch.float32, dtype=torch.float16):
        self.eps = float(NORM_FLOOR)
        self.triples = tuple((float(a), float(b), float(c)) for a, b, c in PE_DAMPED)
        self._restarts = frozenset((2,))
        self.norm_dtype, self.iter_dtype = norm_dtype, dtype
        self._compiled = torch.compile(self._run, fullgraph=True, dynamic=True)

    def __call__(self, x):
        with torch.device(x.device):
            return self._compiled(x)

    def _run(self, x):
        shape_in = x.shape
        if x.ndim == 2:
            x = x.unsqueeze(0)
        elif x.ndim > 3:
            x = x.reshape(-1, *x.shape[-2:])
        dtype_in = x.dtype
        x = x.to(self.norm_dtype)
        tall = x.size(-2) > x.size(-1)
        if tall:
            x = x.mT
        x = x / (x.norm(dim=(-2, -1), keepdim=True) + self.eps)
        x = x.to(self.iter_dtype)
        x = self._iterate(x)
        if tall:
            x = x.mT
        return x.to(dtype_in).reshape(shape_in)

    def _iterate(self, x):
        r = torch.bmm(x, x.mT)
        k = r.size(0)
        eye = (
            torch.eye(r.size(-1), device=x.device, dtype=x.dtype)
            .unsqueeze(0)
            .expand(k, -1, -1)
            .contiguous()
        )
        q = None
        for i, (a, b, c) in enumerate(self.triples):
            if i in self._restarts and i != 0:
                x = torch.bmm(q, x)
                r = torch.bmm(x, x.mT)
                q = None
            z = torch.baddbmm(r, r, r, beta=b, alpha=c)
            if i == 0 or i in self._restarts:
                q = z + a * eye
            else:
                q = torch.baddbmm(q, q, z, beta=a, alpha=1.0)
            if i < len(self.triples) - 1 and i + 1 not in self._restarts:
                rz = torch.baddbmm(r, r, z, beta=a, alpha=1.0)
                r = torch.baddbmm(rz, z, rz, beta=a, alpha=1.0)
        return torch.bmm(q, x)


def _deepmd_blocks(u, k, m, n):
    if u.is_contiguous():
        return u.view(k, m, n)
    return u.reshape(k, m, n).contiguous()


def _deepmd_block_view(shape):
    """Size-1 dims dropped, then the "slice" view (k, m, n); None below two dims."""
    kept = tuple(int(d) for d in shape if int(d) != 1) or (1,)
    if len(kept) < 2:
        return None
    if len(kept) == 2:
        return (1, kept[-2], kept[-1])
    return (int(math.prod(kept[:-2])), kept[-2], kept[-1])


def _deepmd_damping(group, m, n, per_weight):
    """Magma-lite for one bucket: per-block cosine of momentum and gradient in fp32, a sigmoid
    stretched to [0, 1], an in-place EMA kept per parameter, and a factor in [0.1, 1]."""
    count = len(group)
    if count == 0:
        return []
    if count == 1:
        slot, _, gr, mom = group[0]
        k, w = slot["blocks"], slot["weight"]
        ema = per_weight[w].get("align_ema")
        if ema is None or ema.ndim != 1 or ema.numel() != k or ema.device != w.device:
            ema = torch.full((k,), 0.5, dtype=torch.float32, device=w.device)
        else:
            ema = ema.to(dtype=torch.float32, device=w.device)
        gflat = gr.reshape(k, m, n).reshape(k, -1).to(dtype=torch.float32)
        mflat = mom.reshape(k, m, n).reshape(k, -1).to(dtype=torch.float32)
        inner = (mflat * gflat).sum(dim=1)
        norms = (mflat.norm(dim=1) * gflat.norm(dim=1)).clamp(min=ALIGN_EPS)
        cos = (inner / norms).clamp(min=-1.0, max=1.0)
        stretched = (torch.sigmoid(cos / ALIGN_TEMP) - SIG_LO) / (SIG_HI - SIG_LO)
        stretched = stretched.clamp(min=0.0, max=1.0)
        ema = ALIGN_EMA * ema + (1.0 - ALIGN_EMA) * stretched
        per_weight[w]["align_ema"] = ema
        return [ALIGN_FLOOR + (1.0 - ALIGN_FLOOR) * ema]

    size = m * n
    gparts, mparts, ks = [], [], []
    for slot, _, gr, mom in group:
        k = slot["blocks"]
        gparts.append(gr.reshape(k, size).to(dtype=torch.float32))
        mparts.append(mom.reshape(k, size).to(dtype=torch.float32))
        ks.append(k)
    gall = torch.cat(gparts, dim=0)
    mall = torch.cat(mparts, dim=0)
    inner = (mall * gall).sum(dim=1)
    norms = (mall.norm(dim=1) * gall.norm(dim=1)).clamp(min=ALIGN_EPS)
    cos = (inner / norms).clamp(-1.0, 1.0)
    sig = torch.sigmoid(cos / ALIGN_TEMP)
    stretched = ((sig - SIG_LO) / (SIG_HI - SIG_LO)).clamp(0.0, 1.0)
    out, at = [], 0
    for i, (slot, _, _, _) in enumerate(group):
        k, w = ks[i], slot["weight"]
        ema = per_weight[w].get("align_ema")
        if ema is None or ema.ndim != 1 or ema.numel() != k or ema.device != w.device:
            ema = torch.full((k,), 0.5, dtype=torch.float32, device=w.device)
            per_weight[w]["align_ema"] = ema
        elif ema.dtype != torch.float32:
            ema = ema.to(dtype=torch.float32, device=w.device)
            per_weight[w]["align_ema"] = ema
        ema.mul_(ALIGN_EMA).add_(stretched[at : at + k], alpha=(1.0 - ALIGN_EMA))
        out.append(ALIGN_FLOOR + (1.0 - ALIGN_FLOOR) * ema)
        at += k
    return out


def _deepmd_rect_groups(rect, orth, rate, damp):
    """Rectangular buckets gathered by (short side, device, dtype). Per gathering: each block
    made wide, zero-padded on the long side up to the widest, all concatenated, one Gram call;
    then cut apart, padding dropped, turned back, gain and damping applied, ``add_``."""
    gathered = {}
    for (m, n, where, kind), group in rect.items():
        gkey = (min(m, n), where, kind)
        if gkey not in gathered:
            gathered[gkey] = []
        gathered[gkey].append((m, n, m > n, group))

    for _, members in gathered.items():
        width = max(max(h, v) for h, v, _, _ in members)
        wides, meta = [], []
        for m, n, tall, group in members:
            long = max(m, n)
            for slot, u, _, _ in group:
                k = slot["blocks"]
                blk = _deepmd_blocks(u, k, m, n)
                if tall:
                    blk = blk.transpose(-2, -1)
                extra = width - long
                if extra > 0:
                    blk = torch.nn.functional.pad(blk, (0, extra))
                wides.append(blk)
                meta.append((slot, k, long, tall))

        joined = torch.cat(wides, dim=0)
        o = orth(joined)

        at = 0
        for slot, k, long, tall in meta:
            piece = o[at : at + k]
            at += k
            if long < width:
                piece = piece[:, :, :long]
            if tall:
                piece = piece.transpose(-2, -1)
            m0, n0 = slot["height"], slot["width"]
            if GAIN_MODE <= 0:
                gain = GAIN_COEFF * math.sqrt(float(max(m0, n0)))
            else:
                gain = max(1.0, m0 / n0) ** 0.5
            piece = piece * gain
            d = damp.get(id(slot["weight"]))
            if d is not None:
                piece = piece * d.view(k, 1, 1).to(dtype=piece.dtype, device=piece.device)
            upd = piece.reshape(slot["weight"].shape)
            slot["weight"].add_(upd, alpha=-rate)


def deepmd_hybrid_muon(params, dtype):
    """The Muon part of DeePMD-kit's HybridMuon under its defaults. The routing table is made on
    the first call; gradients take the buffer's dtype; foreach decay, then foreach lerp momentum
    with Nesterov as ``_foreach_lerp``; buckets keyed (m, n, device, dtype), each ordered by
    ``data_ptr()``; all Magma-lite factors computed before any NS; rectangular buckets merged by
    short side into one compiled Gram call, square buckets ``torch.cat``-ed into one two-stage NS
    each, gain applied in place, damped, ``add_(alpha=-lr)``.

    Not reproduced: the Adam/AdamW part (it takes 1-D, bias-named and non-matrix parameters, and
    there are none here); routing by parameter name; closure, param groups, ``state_dict``; the
    import-time bump of ``torch._dynamo.config.cache_size_limit`` to 64 or more; the Triton
    kernel (unreachable with Gram on, though its selection test stays). Momentum buffers come
    from ``_momentum`` up front rather than lazily from ``self.state``. ``dtype`` stands in for
    the square path's bf16; the Gram path keeps fp32 normalising and fp16 iterating, except for
    the float64 reference where both are float64."""
    bufs = _momentum(params)
    per_weight = {w: {} for w in params}
    slots = []
    gram_on, damp_on, foreach, triton_on = True, True, True, False
    gram_dtypes = (dtype, dtype) if dtype == torch.float64 else (torch.float32, torch.float16)
    orth_cache = []

    def step():
        if not slots:
            for w in params:
                view = _deepmd_block_view(w.shape)
                assert view is not None, "the Adam half is left out"
                k, m, n = view
                slots.append({"weight": w, "blocks": k, "height": m, "width": n})
        rate, beta, decay = LR, MOMENTUM, WD

        decayed, gs, ms, live = [], [], [], []
        for slot, mom in zip(slots, bufs):
            w = slot["weight"]
            gr = w.grad
            if gr is None:
                continue
            if gr.dtype != mom.dtype:
                gr = gr.to(dtype=mom.dtype)
            decayed.append(w)
            gs.append(gr)
            ms.append(mom)
            live.append((slot, gr))

        if decay > 0 and decayed:
            if foreach and len(decayed) > 1:
                torch._foreach_mul_(decayed, 1.0 - rate * decay)
            else:
                for w in decayed:
                    w.mul_(1.0 - rate * decay)
        if not live:
            return

        if foreach and len(gs) > 1:
            torch._foreach_lerp_(ms, gs, 1.0 - beta)
            us = torch._foreach_lerp(gs, ms, beta)
        else:
            for mom, gr in zip(ms, gs):
                mom.lerp_(gr, 1.0 - beta)
            us = [torch.lerp(gr, mom, beta) for gr, mom in zip(gs, ms)]

        by_shape = {}
        for i, (slot, _) in enumerate(live):
            u = us[i]
            bkey = (slot["height"], slot["width"], u.device, u.dtype)
            if bkey not in by_shape:
                by_shape[bkey] = []
            by_shape[bkey].append((slot, us[i], gs[i], ms[i]))
        for group in by_shape.values():
            group.sort(key=lambda rec: rec[0]["weight"].data_ptr())

        damp = {}
        if damp_on:
            for (m, n, _, _), group in by_shape.items():
                found = _deepmd_damping(group, m, n, per_weight)
                for (slot, _, _, _), f in zip(group, found):
                    damp[id(slot["weight"])] = f

        square, rect = {}, {}
        for bkey, group in by_shape.items():
            m, n = bkey[0], bkey[1]
            if gram_on and m != n:
                rect[bkey] = group
            else:
                square[bkey] = group

        if rect:
            if not orth_cache:
                orth_cache.append(_DeepmdGramCall(*gram_dtypes))
            _deepmd_rect_groups(rect, orth_cache[0], rate, damp)

        for (m, n, where, _), group in square.items():
            if GAIN_MODE <= 0:
                gain = GAIN_COEFF * math.sqrt(float(max(m, n)))
            else:
                gain = max(1.0, m / n) ** 0.5
            parts, spans, at = [], [], 0
            for slot, u, _, _ in group:
                k = slot["blocks"]
                parts.append(_deepmd_blocks(u, k, m, n))
                spans.append((at, k))
                at += k
            joined = torch.cat(parts, dim=0)

            total = joined.size(0)
            short = min(m, n)
            triton = (not gram_on and total == 1 and triton_on
                      and where.type == "cuda" and short >= TRITON_MIN)
            if triton:
                raise NotImplementedError("the Triton flash kernel is left out")
            o = _deepmd_two_stage_ns(joined, dtype=dtype)

            o.mul_(gain)

            for i, (slot, _, _, _) in enumerate(group):
                start, k = spans[i]
                piece = o[start : start + k]
                d = damp.get(id(slot["weight"]))
                if d is not None:
                    piece = piece * d.view(k, 1, 1).to(dtype=piece.dtype, device=piece.device)
                upd = piece.reshape(slot["weight"].shape)
                slot["weight"].add_(upd, alpha=-rate)

    return step


def count_loops(shapes):
    """NS loops in one step, by the source's bucketing (Gram on): one two-stage NS per distinct
    square (m, n), one Gram call per distinct short side among the rectangular ones. Shapes go
    through the "slice" view first; ones without a view (the Adam part) run none. One device and
    one dtype assumed, as in the tests."""
    blocks = {v[1:] for v in map(_deepmd_block_view, shapes) if v is not None}
    square = {mn for mn in blocks if mn[0] == mn[1]}
    short_sides = {min(mn) for mn in blocks if mn[0] != mn[1]}
    return len(square) + len(short_sides)


ENTRY = Entry("deepmd_hybrid_muon",
              "deepmodeling/deepmd-kit deepmd/pt/optimizer/hybrid_muon.py (HybridMuonOptimizer, Muon half)",
              "training repository", deepmd_hybrid_muon, torch.bfloat16, stacks=True, loops_of=count_loops,
              today="1/2 matched")
