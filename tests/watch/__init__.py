"""`plan status`, `plan watch`, incidents and `plan report`."""
