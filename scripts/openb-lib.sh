# Sourced by openb-bench.sh and openb-dynamic-bench.sh: the FGD paper's openb
# node list (`openb_node_list_gpu_node.csv`: sn,cpu_milli,memory_mib,gpu,model)
# as an `xp sim --cluster-csv` file.
openb_cluster_csv() {
  awk -F, 'NR == 1 { print "node_id,gpus,gpu_model,cpu_milli,mem_mib"; next }
    { print $1 "," $4 "," $5 "," $2 "," $3 }' "$1" >"$2"
}
