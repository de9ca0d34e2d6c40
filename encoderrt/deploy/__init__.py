"""Scale-out: encoderrt replicas on an existing distributed engine (ray.py: Ray Serve), never a balancer of our own."""
