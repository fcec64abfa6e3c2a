"""The kubelet pod-resources API."""
