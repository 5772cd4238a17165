"""MG-WFBP (DESIGN.md section 4): not built yet."""
