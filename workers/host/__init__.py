"""What a worker process takes from the machine: its threads and its signals."""
