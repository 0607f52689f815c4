"""Optional bridges to other training engines (each needs its engine installed; see README)."""
