"""The operator: kopf wiring (handlers), the per-job reconcile pass, the pure state machine and Kubernetes I/O."""
