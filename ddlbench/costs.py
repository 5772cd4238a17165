"""The collectives each compressor starts for a bucket (docs/DESIGN.md section 7), as formulas: no
torch. (What a collective sends is declared in ``ddlbench.collectives``.)"""
from __future__ import annotations


