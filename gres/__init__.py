"""gres.conf and Gres= rebuilt from NVML on every node start, with drift detection.

Not built yet: this package only reserves the layout's place (issue 5).
"""

__all__: list[str] = []
