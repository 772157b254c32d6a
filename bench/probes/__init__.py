"""Probes: kernel variants cut out of a copy of a kernel's source, or compiled to SASS, to
see where time goes. Their outputs are measurements, never results a user runs."""
