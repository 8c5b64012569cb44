"""MLflow behind one door (runs, metrics, artifacts, registry), and the register stage."""
