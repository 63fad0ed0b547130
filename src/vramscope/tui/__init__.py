"""Terminal rendering of samples (the only place that imports rich). Never touches a backend."""
