"""Analysis: pure functions over sample series (peaks, leak trend, OOM forecast)."""
