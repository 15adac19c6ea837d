#!/usr/bin/env python3
"""A model of the dequantising producer's lane map (PrefillVectorShare in
src/kernels/prefill/prefill_tile_loads.cuh) at every head_dim, fp8 (2 units
per 16-byte vector of codes) and NVFP4 (4): each store address (base XOR a
constant plus a constant) equals wgmma.cuh's swizzle_offset() of the row and
unit it stands for, the tile is covered once, every quarter warp's 16-byte
stores hit 8 different bank groups, and every load instruction of a warp
reads whole rows. Run it after changing either file:
  python3 tools/prefill_vector_share_model.py
"""
def check(T, V, W, D):
    QV=8//W; QR=W; G=128*16//T; VB=V//QV; RB=G//8//VB; R=RB*QR; C=16//R
    assert RB>=1 and RB*VB*8==G and R*C==16
    def grp(pt): return pt//G
    def quarter(pt): return pt%G//8
    def r0(pt): return quarter(pt)//VB*QR + pt%8//QV
    def vec(pt): return quarter(pt)%VB*QV + pt%8%QV
    def swz(r,u): return (u>>3)*T*128 + r*128 + (((u&7)^(r&7))<<4)
    tile=1024*7
    seen=set()
    for pt in range(128):
        r=r0(pt); m=vec(pt)
        base=tile + m//QV*T*128 + (16*grp(pt)+r)*128 + (((W*m)^r)&7)*16
        for k in range(C):
            for j in range(W):
                a=(base ^ (((j^(R*k))&7)*16)) + R*k*128
                row=16*grp(pt)+r+R*k; u=W*m+j
                assert a==tile+swz(row,u),(pt,k,j)
                seen.add((row,u))
    assert len(seen)==T*V*W
    # conflicts: for each warp, k, j, quarter
    worst=0
    for w in range(4):
        for k in range(C):
            for j in range(W):
                for q in range(4):
                    banks=set()
                    for l in range(8):
                        pt=w*32+q*8+l
                        base=tile + vec(pt)//QV*T*128 + (16*grp(pt)+r0(pt))*128 + (((W*vec(pt))^r0(pt))&7)*16
                        a=(base ^ (((j^(R*k))&7)*16)) + R*k*128
                        banks.add((a//16)%8)
                    worst=max(worst,8//len(banks) if len(banks) else 0)
                    assert len(banks)==8,(T,V,W,w,k,j,q,banks)
    # loads: per warp instr k, rows touched and whole rows
    for w in range(4):
        for k in range(C):
            rows={}
            for l in range(32):
                pt=w*32+l; row=16*grp(pt)+r0(pt)+R*k
                rows.setdefault(row,set()).add(vec(pt))
            assert all(len(v)==V for v in rows.values()),rows
    print(f"D{D} T{T} V{V} W{W}: R={R} per-thread={C} ok, rows/load-instr/warp={len(rows)}")
for D in (64,128,256):
    T=128 if D<=128 else 64
    check(T, D//16, 2, D)   # fp8
    check(T, D//32, 4, D)   # nvfp4
