"""Sources of readings. Each module alone imports its library (pynvml, torch, psutil)."""
