"""A model of h_v4_dec's named barriers (gpu/flash_hopper.cu, flash_bwd_h MODE bit 11), run under
random schedules on the CPU: no deadlock, no barrier left part-arrived at the end, and no barrier
instance completed by arrivals meant for different tiles (a sender a tile ahead of its owners).

Actors are warps: warpgroup w's owners (2 warps) and senders (2 warps). Per tile, in the kernel's
order: the stage barrier (2 + w, the warpgroup's 4 warps), the score products (warpgroup-collective,
modelled as a barrier of its 4 warps), the owners' deferred adds (their group barrier 12 + w twice,
then, when a sender will write that buffer again, an arrival at xempty 8 + 2 w + parity), the dV / dK
products, the dS barrier (2 + w), the dQ product, then the exchange: a sender waits for xempty of
its owners (from the third tile on), writes and arrives at xfull 4 + 2 (1 - w) + parity; an owner
waits at xfull 4 + 2 w + parity. The tail: a block barrier, the owners' last adds, a block barrier.
Each warp is given a random speed per run (0.01x to 100x), which finds the rare interleavings.

    python benchmarks/kernels/dec_barriers.py            # the kernel's protocol: all "ok"
    python benchmarks/kernels/dec_barriers.py --design pair   # h_v4_pair's (MODE bit 10): all "ok"
    python benchmarks/kernels/dec_barriers.py --break xfull_parity   # or xempty_parity, xempty_always,
                                                         # sender_early: each found (seen in the session that wrote it)

The model is the protocol as written down here, not read from the kernel: keep the two together.
"""
import argparse
import random


def program(w, owner, iters, brk=None, design="dec"):
    """One warp's events: (kind 'sync' | 'arrive', barrier, warps expected, tag)."""
    if design == "pair":
        return program_pair(w, owner, iters)
    ev = []
    for it in range(iters):
        ev.append(("sync", 2 + w, 4, ("top", it)))
        ev.append(("sync", ("wgmma", w, "scores"), 4, ("scores", it)))
        if owner and it >= 1:
            ev.append(("sync", 12 + w, 2, ("adds", it)))
            ev.append(("sync", 12 + w, 2, ("turn", it)))
            if it + 1 < iters or brk == "xempty_always":
                par = 0 if brk == "xempty_parity" else (it - 1) & 1
                ev.append(("arrive", 8 + 2 * w + par, 4, ("xempty", it + 1)))
        ev.append(("sync", ("wgmma", w, "dvdk"), 4, ("dvdk", it)))
        ev.append(("sync", 2 + w, 4, ("ds", it)))
        ev.append(("sync", ("wgmma", w, "dq"), 4, ("dq", it)))
        fpar = 0 if brk == "xfull_parity" else it & 1
        if not owner:
            if it >= (1 if brk == "sender_early" else 2):
                par = 0 if brk == "xempty_parity" else it & 1
                ev.append(("sync", 8 + 2 * (1 - w) + par, 4, ("xempty", it)))
            ev.append(("arrive", 4 + 2 * (1 - w) + fpar, 4, ("xfull", it)))
        else:
            ev.append(("sync", 4 + 2 * w + fpar, 4, ("xfull", it)))
    ev.append(("sync", 0, 8, ("tail",)))
    if owner and iters >= 1:
        ev += [("sync", 12 + w, 2, ("last adds",)), ("sync", 12 + w, 2, ("last turn",)), ("sync", 12 + w, 2, ("release",))]
    ev.append(("sync", 0, 8, ("end",)))
    return ev


def program_pair(w, owner, iters):
    """h_v4_pair (MODE bit 10): the block's stage barrier every tile, the dS barrier of the
    warpgroup, the owner groups' own barrier (6 + w), the exchange by xfull 4 + the owners'
    warpgroup (no parity: the block barrier keeps the warpgroups within a tile)."""
    ev = []
    for it in range(iters):
        ev.append(("sync", 0, 8, ("top", it)))
        ev.append(("sync", ("wgmma", w, "scores"), 4, ("scores", it)))
        if owner and it >= 1:
            ev.append(("sync", 6 + w, 2, ("turn", it)))
        ev.append(("sync", ("wgmma", w, "dvdk"), 4, ("dvdk", it)))
        ev.append(("sync", 2 + w, 4, ("ds", it)))
        ev.append(("sync", ("wgmma", w, "dq"), 4, ("dq", it)))
        if owner:
            ev.append(("sync", 4 + w, 4, ("xfull", it)))
        else:
            ev.append(("arrive", 4 + (1 - w), 4, ("xfull", it)))
    ev.append(("sync", 0, 8, ("tail",)))
    if owner and iters >= 1:
        ev.append(("sync", 6 + w, 2, ("last turn",)))
    ev.append(("sync", 0, 8, ("end",)))
    return ev


def run(iters, seed, brk=None, design="dec"):
    rnd = random.Random(seed)
    warps = [dict(ev=program(w, k // 2 == w, iters, brk, design), pc=0, wait=None) for w in range(2) for k in range(4)]
    speed = [rnd.choice([0.01, 0.1, 1, 10, 100]) for _ in warps]
    bars, done = {}, {}   # barrier -> its open instance; barrier -> last instance completed

    def released(x):
        return x["wait"] is None or done.get(x["wait"][0], -1) >= x["wait"][1]

    while True:
        ready = [i for i, x in enumerate(warps) if x["pc"] < len(x["ev"]) and released(x)]
        if not ready:
            if all(released(x) for x in warps):
                left = {k: b["count"] for k, b in bars.items() if b["count"]}
                return "ok" if not left else f"left part-arrived: {left}"
            return "deadlock at " + str([x["ev"][x["pc"] - 1][3] for x in warps])
        x = warps[rnd.choices(ready, weights=[speed[i] for i in ready])[0]]
        x["wait"] = None
        kind, bid, n, tag = x["ev"][x["pc"]]
        x["pc"] += 1
        b = bars.setdefault(bid, dict(count=0, gen=0, tags=set()))
        b["count"] += 1
        b["tags"].add(tag)
        gen = b["gen"]
        if b["count"] == n:
            if len(b["tags"]) > 1:
                return f"barrier {bid} completed by {sorted(b['tags'])}"
            done[bid] = gen
            b.update(count=0, gen=gen + 1, tags=set())
        if kind == "sync":
            x["wait"] = (bid, gen)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--break", dest="brk", choices=["xfull_parity", "xempty_parity", "xempty_always", "sender_early"])
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--design", choices=["dec", "pair"], default="dec", help="h_v4_dec (MODE 3640) or h_v4_pair (1592)")
    a = ap.parse_args()
    for iters in (1, 2, 3, 4, 5, 8):
        found = {run(iters, s, a.brk, a.design) for s in range(a.runs)}
        print(f"{iters} tiles: " + "; ".join(sorted(found))[:200])


if __name__ == "__main__":
    main()
