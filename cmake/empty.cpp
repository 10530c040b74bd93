// libfragctl.so is the whole-archive union of the layer libraries.
