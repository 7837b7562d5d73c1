"""Reliability: what keeps a run from hanging or losing work (stop signals, loader faults and the
watchdog, guarded reads, rendezvous). Mechanisms only: they take their settings as arguments."""
