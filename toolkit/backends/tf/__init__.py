"""TensorFlow tf.distribute: MirroredStrategy and MultiWorkerMirroredStrategy."""
