"""The TensorFlow program every node of a tfcluster runs (`python -m trainer`)."""
