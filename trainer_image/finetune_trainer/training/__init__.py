"""Training: the model and its method, the Trainer's callbacks (progress, checkpoint marks, divergence, uploads),
throughput and MFU, samples, and what a run tells the user."""
