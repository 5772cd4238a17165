"""ByteScheduler-A2A (DESIGN.md section 5): not built yet."""
